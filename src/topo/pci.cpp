#include "topo/pci.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ridge::topo {

bool isGpuClass(uint16_t classId, uint16_t vendor) {
  if ((classId >> 8) != 0x03) return false;
  switch (vendor) {
    case 0x1a03:  // ASPEED (server BMC)
    case 0x102b:  // Matrox (server BMC)
    case 0x1013:  // Cirrus Logic (emulated)
    case 0x1234:  // QEMU/Bochs standard VGA
    case 0x1b36:  // Red Hat QXL
    case 0x1af4:  // virtio-gpu
    case 0x15ad:  // VMware SVGA
    case 0x80ee:  // VirtualBox
    case 0x1414:  // Hyper-V synthetic video
      return false;
    default: return true;
  }
}

bool isNicClass(uint16_t classId) {
  return (classId >> 8) == 0x02;
}

const char* pciVendorShortName(uint16_t vendor) {
  switch (vendor) {
    case 0x10de: return "NVIDIA";
    case 0x1002: return "AMD";
    case 0x1022: return "AMD";
    case 0x8086: return "Intel";
    case 0x15b3: return "Mellanox";
    case 0x14e4: return "Broadcom";
    case 0x1077: return "QLogic";
    case 0x1924: return "Solarflare";
    case 0x1d0f: return "Amazon";
    case 0x1af4: return "virtio";
    case 0x1ae0: return "Google";
    case 0x1da3: return "Habana";
    case 0x19e5: return "Huawei";
    case 0x1014: return "IBM";
    case 0x1a03: return "ASPEED";
    case 0x102b: return "Matrox";
    default: return "";
  }
}

int pcieGenFromGts(double gt) {
  // Per-lane signalling rates of PCIe generations 1 to 6.
  static const double kRates[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
  for (int i = 0; i < 6; ++i) {
    if (std::fabs(gt - kRates[i]) < 0.26) return i + 1;
  }
  return 0;
}

std::string pcieLinkText(int width, double gtPerSec) {
  int gen = pcieGenFromGts(gtPerSec);
  std::string s;
  if (width > 0) s += "x" + std::to_string(width);
  if (gen > 0) s += (s.empty() ? "Gen" : " Gen") + std::to_string(gen);
  return s.empty() ? s : "PCIe " + s;
}

std::string pcieLinkTextFromGBs(double gbPerSec) {
  if (!(gbPerSec > 0)) return "";
  char buf[48];
  std::snprintf(buf, sizeof buf, "PCIe %.2f GB/s", gbPerSec);
  return buf;
}

double parseGts(const std::string& text) {
  const char* p = text.c_str();
  char* end = nullptr;
  double v = std::strtod(p, &end);
  if (end == p || !(v > 0)) return 0;
  return v;
}

std::string describePciDevice(const std::string& busId, uint16_t vendor, uint16_t device,
                              const std::string& vendorName, const std::string& deviceName,
                              const std::vector<std::string>& osNames, const std::string& link) {
  std::string s = busId;
  auto add = [&s](const std::string& part) {
    if (part.empty()) return;
    if (!s.empty()) s += ' ';
    s += part;
  };
  if (!vendorName.empty()) {
    add(vendorName);
  } else {
    add(pciVendorShortName(vendor));
  }
  if (!deviceName.empty()) {
    add(deviceName);
  } else if (vendor != 0 || device != 0) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "[%04x:%04x]", vendor, device);
    add(buf);
  }
  if (!osNames.empty()) {
    std::string names = "[";
    for (size_t i = 0; i < osNames.size(); ++i) names += (i ? "," : "") + osNames[i];
    add(names + "]");
  }
  if (!link.empty()) add("(" + link + ")");
  return s;
}

bool isDrmDeviceName(const std::string& name) {
  return name.rfind("card", 0) == 0 || name.rfind("renderD", 0) == 0 || name.rfind("controlD", 0) == 0;
}

}  // namespace ridge::topo
