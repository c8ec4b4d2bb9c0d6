// PCI vocabulary shared by the topology readers: which classes are GPUs and NICs, short
// vendor names, and how a PCIe link is written. Pure functions, no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ridge::topo {

/// True for a device Ridge treats as a GPU: PCI base class 0x03 (display), except the
/// board-management and emulated VGA adapters that every server or VM has (ASPEED, Matrox,
/// QEMU, ...). `classId` is base class and subclass (0x0302 for a 3D controller); `vendor`
/// 0 means unknown (NCCL files often leave it out) and does not exclude the device.
bool isGpuClass(uint16_t classId, uint16_t vendor);

/// True for PCI base class 0x02 (network: Ethernet 0x0200, InfiniBand 0x0207, ...).
bool isNicClass(uint16_t classId);

/// A short vendor name ("NVIDIA", "Mellanox", ...) or "" when the id is not in the table.
const char* pciVendorShortName(uint16_t vendor);

/// PCIe generation (1 to 6) for a per-lane rate in GT/s, 0 when it does not match one.
int pcieGenFromGts(double gtPerSec);

/// "PCIe x16 Gen4" from a width and per-lane rate; "PCIe x16" or "PCIe Gen4" when one part
/// is unknown (0); "" when both are.
std::string pcieLinkText(int width, double gtPerSec);

/// "PCIe 15.75 GB/s" from hwloc's total link bandwidth (GB/s), "" when 0. hwloc XML does not
/// keep width and rate apart, so this is what a file can tell.
std::string pcieLinkTextFromGBs(double gbPerSec);

/// Leading number of a sysfs or NCCL link speed such as "16.0 GT/s PCIe" or "8 GT/s"; 0 when
/// there is none ("Unknown", "").
double parseGts(const std::string& text);

/// One device line: "<busid> <vendor> <device> [<os names>] (<link>)". Empty parts are left
/// out. `vendorName`/`deviceName` are free text when the source has them; otherwise the short
/// vendor name and the hexadecimal device id are used.
std::string describePciDevice(const std::string& busId, uint16_t vendor, uint16_t device,
                              const std::string& vendorName, const std::string& deviceName,
                              const std::vector<std::string>& osNames, const std::string& link);

/// True for the DRM nodes every display device has (card0, renderD128, controlD64), which
/// say nothing about compute and are left out of GPU names when better names exist.
bool isDrmDeviceName(const std::string& name);

}  // namespace ridge::topo
