// Maps a GPU-NIC pair of a Topology onto the GDR advisor's input (gdr_advisor.h): the PCIe
// route between them and to the host memory next to the NIC, as the hops the PCIe
// transaction model counts (links with their generation and width, switch traversals, root
// complexes, the socket link), plus what the NIC offers (on-NIC staging memory, port rate).
#pragma once

#include "core/status.h"
#include "topo/gdr_advisor.h"
#include "topo/model.h"

namespace ridge::topo {

/// The hops of the tree route from node `from` to node `to`, in order, with `completer` at
/// `to`'s end. A PCIe link is one with a generation (or, failing that, a bandwidth) between
/// two different switch units or a unit and a device; the edges inside a switch or a root
/// complex are not links but part of that hop.
Route routeBetween(const Topology& t, int from, int to, Completer completer);

/// Fills `out` for GPU `gpu` and NIC `nic` of `t`: GPU->NIC route (completer NicMemory),
/// GPU and NIC to the NIC's NUMA node (host memory), the placement class in nvidia-smi's
/// words, on-NIC memory from Node::nicDeviceMemory and the port rate (fastest port, Gb/s / 8).
/// ridgeInvalidArgument when the ids are not a GPU and a NIC.
Status gdrPlacementFor(const Topology& t, int gpu, int nic, GdrPlacement* out);

}  // namespace ridge::topo
