// Built-in machine descriptions: well-known server layouts that Ridge can plan for, draw and
// test against without having the hardware. Each is built with the Topology builder API;
// presets.cpp says where every number comes from.
//
//   dgx-a100           2x AMD EPYC (Rome, NPS4), 8x A100 SXM4 on 6 NVSwitches (NV12),
//                      8x 200G HDR ConnectX-6, four Gen4 switch trees of 2 GPUs + 2 NICs
//   dgx-h100           2x Xeon (Sapphire Rapids), 8x H100 SXM5 on 4 NVSwitches (NV18),
//                      8x 400G NDR ConnectX-7, each GPU sharing a Gen5 switch with its NIC
//   pcie-8gpu-2socket  2x AMD EPYC, 8 PCIe GPUs (no NVLink), 4 per socket under two levels
//                      of Gen4 switches, one 100G NIC per socket on a root port
//   cross-rc           1 GPU and 1 NIC under different host bridges of socket 0, a second
//                      GPU on socket 1: the placements (NODE, SYS) where GPUDirect RDMA
//                      reads suffer and GDR-write is meant to help
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "topo/model.h"

namespace ridge::topo {

/// Names of the built-in presets, in a fixed order.
std::vector<std::string> presetNames();

/// One line describing a preset ("" for an unknown name), for help texts.
std::string presetDescription(const std::string& name);

/// Builds preset `name` into `out` (finalized; name = the preset's name, source = "preset
/// NAME"). An unknown name is ridgeInvalidArgument, with the list of known ones.
Status loadPreset(const std::string& name, Topology* out);

}  // namespace ridge::topo
