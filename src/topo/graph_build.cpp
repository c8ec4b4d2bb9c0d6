#include "topo/graph_build.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "topo/pci.h"

namespace ridge::topo {

namespace {

// Per-lane signalling rates of PCIe generations 1 to 6 (GT/s), NCCL's per-lane codes for
// them, and the line encoding hwloc applies when it turns a rate into GB/s.
constexpr double kGenRates[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
constexpr double kGenCodes[] = {15, 30, 60, 120, 240, 480};
constexpr double kGenEncoding[] = {0.8, 0.8, 128.0 / 130, 128.0 / 130, 128.0 / 130, 128.0 / 130};
constexpr int kWidths[] = {1, 2, 4, 8, 12, 16, 32};

bool containsNoCase(const std::string& hay, const char* needle) {
  std::string h = hay, n = needle;
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return h.find(n) != std::string::npos;
}

bool isHex(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

double pcieLaneCode(double gt) {
  if (!(gt > 0) || !std::isfinite(gt)) return 0;
  for (int i = 0; i < 6; ++i)
    if (std::fabs(gt - kGenRates[i]) < 0.26) return kGenCodes[i];
  // Not a standard rate: the code is 6 per GT/s with 8b/10b (Gen1/2), 7.5 with 128b/130b.
  return gt * (gt < 8 ? 6.0 : 7.5);
}

double pcieBandwidthGBs(int width, double gt) {
  if (width <= 0) return 0;
  return width * pcieLaneCode(gt) / 80.0;
}

double pcieBandwidthFromHwlocGBs(double hwlocGBs, int* gen, int* width) {
  *gen = 0;
  *width = 0;
  if (!(hwlocGBs > 0) || !std::isfinite(hwlocGBs)) return 0;
  int matches = 0;
  double nccl = 0;
  for (int g = 0; g < 6; ++g) {
    for (int w : kWidths) {
      const double v = w * kGenRates[g] * kGenEncoding[g] / 8.0;
      if (std::fabs(v - hwlocGBs) <= 0.01 * v) {
        ++matches;
        nccl = w * kGenCodes[g] / 80.0;
        *gen = g + 1;
        *width = w;
      }
    }
  }
  if (matches == 1) return nccl;
  *gen = 0;
  *width = 0;
  // Ambiguous (several gen x width give it) or odd: the ratio of NCCL's figure to the
  // encoded rate is 7.5*8/80/(128/130) for every generation from Gen3 on.
  return matches > 1 ? nccl : hwlocGBs * (7.5 * 8 / 80.0) * (130.0 / 128);
}

int nvlinkLanesFromHwlocMBs(uint64_t mbs) {
  constexpr uint64_t kV2PlusLinkMBs = 25000, kV1LinkMBs = 20000;
  if (mbs % kV2PlusLinkMBs == 0) return static_cast<int>(std::max<uint64_t>(1, mbs / kV2PlusLinkMBs));
  if (mbs % kV1LinkMBs == 0) return static_cast<int>(mbs / kV1LinkMBs);
  return static_cast<int>(std::max<uint64_t>(1, (mbs + kV2PlusLinkMBs / 2) / kV2PlusLinkMBs));
}

double nvlinkLaneGBs(int sm) {
  if (sm <= 0) return kDefaultNvLinkLaneGBs;
  if (sm < 70) return 18;     // Pascal
  if (sm < 80) return 20;     // Volta (and Turing's NVLink bridge)
  if (sm < 86) return 20;     // A100
  if (sm < 90) return 12;     // sm86/87/89 (GA10x NVLink bridge)
  if (sm < 100) return 20.6;  // Hopper
  return 40.1;                // Blackwell and later
}

double socketLinkGBs(const CpuIdentity& cpu) {
  const bool intel = cpu.vendor == "GenuineIntel" || containsNoCase(cpu.modelName, "intel");
  const bool amd = cpu.vendor == "AuthenticAMD" || cpu.vendor == "HygonGenuine" ||
                   containsNoCase(cpu.modelName, "amd epyc") || containsNoCase(cpu.modelName, "amd ");
  if (containsNoCase(cpu.modelName, "power") || cpu.arch.rfind("ppc", 0) == 0) return 32;
  if (amd) return 16;
  if (intel) {
    // Intel server models: Skylake-SP (0x55) and Ice Lake (0x6a, 0x6c) 10, Sapphire Rapids
    // (0x8f) 22, Emerald Rapids (0xcf) 40; Broadwell and older 6.
    if (cpu.family == 6 && cpu.model >= 0xcf) return 40;
    if (cpu.family == 6 && cpu.model >= 0x8f) return 22;
    if (cpu.family == 6 && cpu.model >= 0x55) return 10;
    return 6;
  }
  if (cpu.arch == "aarch64" || cpu.arch == "arm64") return 6;
  return kDefaultSocketLinkGBs;
}

void addSocketLinks(Topology* t, const std::vector<int>& packages, double bandwidthGBs) {
  for (size_t i = 0; i < packages.size(); ++i) {
    for (size_t j = i + 1; j < packages.size(); ++j) {
      Link l;
      l.kind = LinkKind::Socket;
      l.a = packages[i];
      l.b = packages[j];
      l.bandwidthGBs = bandwidthGBs;
      l.latencyNs = kSocketLinkLatencyNs;
      t->addLink(l);
    }
  }
}

double treeEdgeLatencyNs(const Topology& t, int parent, int child) {
  const NodeKind pk = t.node(parent).kind, ck = t.node(child).kind;
  if (ck == NodeKind::HostBridge) return kHostBridgeLatencyNs;
  if (ck == NodeKind::PciBridge)
    return pk == NodeKind::HostBridge ? kRootPortLatencyNs : kPcieSwitchPortLatencyNs;
  if (pk == NodeKind::Numa || pk == NodeKind::Package || pk == NodeKind::Machine) {
    // A device with no bridge above it in the file (NCCL files, VMs): it sits on a root port.
    return kRootPortLatencyNs;
  }
  return kPcieLinkLatencyNs;
}

double fastestChildLinkGBs(const Topology& t, int parent) {
  double best = 0;
  for (const Link& l : t.links())
    if (l.a == parent && l.b >= 0 && l.b < static_cast<int>(t.nodes().size()) && t.node(l.b).parent == parent)
      best = std::max(best, l.bandwidthGBs);
  return best;
}

NodeKind kindForPciClass(uint32_t pciClass, uint16_t vendor) {
  const uint16_t cls = pciClassId16(pciClass);
  if (isGpuClass(cls, vendor)) return NodeKind::Gpu;
  if (isNicClass(cls)) return NodeKind::Nic;
  if (cls == 0x0108) return NodeKind::Nvme;
  if (cls == 0x0604) return NodeKind::PciBridge;
  if (cls == 0x0680 && vendor == 0x10de) return NodeKind::NvSwitch;
  return NodeKind::PciDevice;
}

bool normalizeBusId(const std::string& in, std::string* out) {
  // [dddd:]bb:dd.f with hex digits; the domain may have up to 8 digits (VMD domains).
  size_t c2 = in.rfind(':');
  if (c2 == std::string::npos) return false;
  size_t c1 = c2 == 0 ? std::string::npos : in.rfind(':', c2 - 1);
  const std::string domain = c1 == std::string::npos ? "0" : in.substr(0, c1);
  const std::string bus =
      in.substr(c1 == std::string::npos ? 0 : c1 + 1, c2 - (c1 == std::string::npos ? 0 : c1 + 1));
  const size_t dot = in.find('.', c2);
  if (dot == std::string::npos) return false;
  const std::string dev = in.substr(c2 + 1, dot - c2 - 1), fn = in.substr(dot + 1);
  auto hexOk = [](const std::string& s, size_t maxLen) {
    if (s.empty() || s.size() > maxLen) return false;
    return std::all_of(s.begin(), s.end(), isHex);
  };
  if (!hexOk(domain, 8) || !hexOk(bus, 2) || !hexOk(dev, 2) || !hexOk(fn, 1)) return false;
  const unsigned long d = std::strtoul(domain.c_str(), nullptr, 16),
                      b = std::strtoul(bus.c_str(), nullptr, 16), v = std::strtoul(dev.c_str(), nullptr, 16),
                      f = std::strtoul(fn.c_str(), nullptr, 16);
  if (v > 0x1f || f > 7) return false;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04lx:%02lx:%02lx.%lx", d, b, v, f);
  *out = buf;
  return true;
}

Status xmlError(const std::string& what, const XmlElement& e, const std::string& message) {
  return makeError(ridgeInvalidArgument, "%s:%d: <%s>: %s", what.c_str(), e.line, e.name.c_str(),
                   message.c_str());
}

std::string stringAttribute(const XmlElement& e, const char* key) {
  const std::string* v = e.attribute(key);
  return v ? *v : std::string();
}

static std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

Status intAttribute(const std::string& what, const XmlElement& e, const char* key, long long lo, long long hi,
                    long long* out, bool* present) {
  const std::string* v = e.attribute(key);
  if (present) *present = v != nullptr;
  if (!v) return Status::ok();
  const std::string s = trimmed(*v);
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    return xmlError(what, e, format("attribute %s=\"%s\" is not a number", key, v->c_str()));
  if (x < lo || x > hi)
    return xmlError(what, e, format("attribute %s=%lld is out of range [%lld, %lld]", key, x, lo, hi));
  *out = x;
  return Status::ok();
}

Status realAttribute(const std::string& what, const XmlElement& e, const char* key, double lo, double hi,
                     double* out, bool* present) {
  const std::string* v = e.attribute(key);
  if (present) *present = v != nullptr;
  if (!v) return Status::ok();
  const std::string s = trimmed(*v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(x))
    return xmlError(what, e, format("attribute %s=\"%s\" is not a number", key, v->c_str()));
  if (x < lo || x > hi)
    return xmlError(what, e, format("attribute %s=%g is out of range [%g, %g]", key, x, lo, hi));
  *out = x;
  return Status::ok();
}

std::string baseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace ridge::topo
