#include "topo/summary.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>

#include "core/log.h"
#include "topo/pci.h"
#include "topo/sysfs.h"
#include "topo/xml.h"

#ifdef RIDGE_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace ridge {

using topo::listDir;
using topo::parseCpuList;
using topo::readFirstLine;
using topo::XmlElement;

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Counts a classified PCI device and keeps its description line.
void addDevice(HostSummary* out, bool gpu, std::string line) {
  if (gpu) {
    ++out->gpus;
    out->gpuNames.push_back(std::move(line));
  } else {
    ++out->nics;
    out->nicNames.push_back(std::move(line));
  }
}

std::string thisHostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

// ---- /proc and /sys --------------------------------------------------------------------

bool readHexFile(const std::string& path, unsigned long* out) {
  std::string s;
  if (!readFirstLine(path, &s) || s.empty()) return false;
  char* end = nullptr;
  *out = std::strtoul(s.c_str(), &end, 16);
  return end != s.c_str();
}

// Collects GPUs and NICs from /sys/bus/pci/devices. Also used to put the link width and
// rate, which hwloc does not keep apart, next to the devices hwloc found.
struct SysfsPciLink {
  int width = 0;
  double gts = 0;
};

SysfsPciLink sysfsPciLink(const std::string& busId) {
  SysfsPciLink link;
  std::string dir = "/sys/bus/pci/devices/" + busId + "/", s;
  if (readFirstLine(dir + "current_link_width", &s)) link.width = std::atoi(s.c_str());
  if (readFirstLine(dir + "current_link_speed", &s)) link.gts = topo::parseGts(s);
  return link;
}

void sysfsPciDevices(HostSummary* out) {
  const std::string root = "/sys/bus/pci/devices/";
  for (const std::string& busId : listDir(root)) {
    unsigned long cls = 0, vendor = 0, device = 0;
    if (!readHexFile(root + busId + "/class", &cls)) continue;
    readHexFile(root + busId + "/vendor", &vendor);
    readHexFile(root + busId + "/device", &device);
    uint16_t classId = static_cast<uint16_t>(cls >> 8);
    bool gpu = topo::isGpuClass(classId, static_cast<uint16_t>(vendor));
    bool nic = topo::isNicClass(classId);
    if (!gpu && !nic) continue;
    std::vector<std::string> names;
    if (nic) {
      // RDMA devices, then network interfaces; virtio NICs keep theirs one level down.
      std::vector<std::string> dirs = {root + busId + "/infiniband", root + busId + "/net"};
      for (const std::string& sub : listDir(root + busId)) {
        if (sub.rfind("virtio", 0) == 0) dirs.push_back(root + busId + "/" + sub + "/net");
      }
      for (const std::string& d : dirs) {
        for (auto& n : listDir(d)) names.push_back(n);
      }
    }
    SysfsPciLink link = sysfsPciLink(busId);
    std::string line =
        topo::describePciDevice(busId, static_cast<uint16_t>(vendor), static_cast<uint16_t>(device), "", "",
                                names, topo::pcieLinkText(link.width, link.gts));
    addDevice(out, gpu, std::move(line));
  }
}

Status sysfsSummary(HostSummary* out) {
  // PUs: online CPUs this process may run on (hwloc likewise drops disallowed PUs).
  std::string online;
  std::vector<int> cpus;
  if (readFirstLine("/sys/devices/system/cpu/online", &online)) cpus = parseCpuList(online);
  if (cpus.empty()) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < n; ++i) cpus.push_back(static_cast<int>(i));
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  bool haveMask = sched_getaffinity(0, sizeof mask, &mask) == 0;
  std::set<int> packages;
  std::set<std::pair<int, int>> cores;
  int pus = 0;
  for (int c : cpus) {
    if (haveMask && c < CPU_SETSIZE && !CPU_ISSET(c, &mask)) continue;
    ++pus;
    std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/", s;
    int pkg = 0, core = c;
    if (readFirstLine(dir + "physical_package_id", &s)) pkg = std::atoi(s.c_str());
    if (readFirstLine(dir + "core_id", &s)) core = std::atoi(s.c_str());
    packages.insert(pkg);
    cores.insert({pkg, core});
  }
  if (pus == 0) return makeError(ridgeSystemError, "sysfs: found no usable CPU");
  int numa = 0;
  for (const std::string& n : listDir("/sys/devices/system/node")) {
    if (n.rfind("node", 0) == 0 && n.size() > 4 && std::isdigit(static_cast<unsigned char>(n[4]))) ++numa;
  }
  out->packages = static_cast<int>(packages.size());
  out->cores = static_cast<int>(cores.size());
  out->pus = pus;
  out->numaNodes = numa > 0 ? numa : 1;
  sysfsPciDevices(out);
  return Status::ok();
}

// ---- hwloc -----------------------------------------------------------------------------

#ifdef RIDGE_HAVE_HWLOC

struct HwlocTopology {
  hwloc_topology_t t = nullptr;
  ~HwlocTopology() {
    if (t) hwloc_topology_destroy(t);
  }
};

int countType(hwloc_topology_t t, hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_by_type(t, type);
  return n < 0 ? 0 : n;  // -1: the type sits on several levels (does not happen for these)
}

// Fills counts and devices from a loaded topology. `live`: this machine, so sysfs can add
// link width and rate.
void fromHwloc(hwloc_topology_t t, bool live, HostSummary* out) {
  out->packages = countType(t, HWLOC_OBJ_PACKAGE);
  out->numaNodes = countType(t, HWLOC_OBJ_NUMANODE);
  out->cores = countType(t, HWLOC_OBJ_CORE);
  out->pus = countType(t, HWLOC_OBJ_PU);
  for (hwloc_obj_t o = hwloc_get_next_pcidev(t, nullptr); o; o = hwloc_get_next_pcidev(t, o)) {
    const auto& pci = o->attr->pcidev;
    bool gpu = topo::isGpuClass(pci.class_id, pci.vendor_id);
    bool nic = topo::isNicClass(pci.class_id);
    if (!gpu && !nic) continue;
    char busId[32];
    std::snprintf(busId, sizeof busId, "%04x:%02x:%02x.%01x", static_cast<unsigned>(pci.domain), pci.bus,
                  pci.dev, pci.func);
    // OS devices (cuda0, mlx5_0, ib0, eth0, card0 ...). Their type enum changed between
    // hwloc 2 and 3, so names are judged by themselves: for GPUs, DRM nodes only when
    // nothing better is there.
    std::vector<std::string> names, drm;
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name) continue;
      if (gpu && topo::isDrmDeviceName(c->name))
        drm.emplace_back(c->name);
      else
        names.emplace_back(c->name);
    }
    if (names.empty()) names = std::move(drm);
    const char* vendorName = hwloc_obj_get_info_by_name(o, "PCIVendor");
    const char* deviceName = hwloc_obj_get_info_by_name(o, "PCIDevice");
    std::string link;
    if (live) {
      SysfsPciLink l = sysfsPciLink(busId);
      link = topo::pcieLinkText(l.width, l.gts);
    }
    if (link.empty()) link = topo::pcieLinkTextFromGBs(pci.linkspeed);
    std::string line =
        topo::describePciDevice(busId, pci.vendor_id, pci.device_id, vendorName ? vendorName : "",
                                deviceName ? deviceName : "", names, link);
    addDevice(out, gpu, std::move(line));
  }
}

const char* rootInfo(hwloc_topology_t t, const char* key) {
  return hwloc_obj_get_info_by_name(hwloc_get_root_obj(t), key);
}

Status hwlocThisHost(HostSummary* out) {
  HwlocTopology topo;
  if (hwloc_topology_init(&topo.t) != 0) return systemError("hwloc_topology_init");
  // GPUs and NICs without every bridge and storage function: what the summary needs.
  hwloc_topology_set_io_types_filter(topo.t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo.t) != 0) return systemError("hwloc_topology_load");
  fromHwloc(topo.t, true, out);
  const char* ver = rootInfo(topo.t, "hwlocVersion");
  out->source = format("hwloc %s (this machine)", ver ? ver : HWLOC_VERSION);
  return Status::ok();
}

#if HWLOC_API_VERSION < 0x00030000
// hwloc 3 writes <topology version="3.0"> and turns osdev_type into a bit mask; hwloc 2
// refuses such files. Object types and attributes are otherwise what hwloc 2 reads, so
// rewrite the version and map each mask to the hwloc 2 type of its most specific bit.
bool downgradeHwloc3Xml(std::string* xml) {
  size_t head = xml->find("<topology");
  if (head == std::string::npos || head > 4096) return false;
  size_t close = xml->find('>', head);
  size_t v = xml->find("version=\"3.", head);
  if (v == std::string::npos || v > close) return false;
  size_t vEnd = xml->find('"', v + 9);
  xml->replace(v, vEnd + 1 - v, "version=\"2.0\"");
  static const char kKey[] = "osdev_type=\"";
  for (size_t p = xml->find(kKey); p != std::string::npos; p = xml->find(kKey, p)) {
    p += sizeof kKey - 1;
    size_t e = xml->find('"', p);
    if (e == std::string::npos) break;
    unsigned long mask = std::strtoul(xml->c_str() + p, nullptr, 10);
    // hwloc 3 bits: 1 storage, 2 memory, 4 GPU, 8 coprocessor, 16 network,
    // 32 OpenFabrics, 64 DMA. hwloc 2 values: 0 block, 1 GPU, 2 network, 3 OpenFabrics,
    // 4 DMA, 5 coprocessor.
    int v2 = 0;
    if (mask & 32)
      v2 = 3;
    else if (mask & 16)
      v2 = 2;
    else if (mask & 8)
      v2 = 5;
    else if (mask & 4)
      v2 = 1;
    else if (mask & 64)
      v2 = 4;
    xml->replace(p, e - p, std::to_string(v2));
  }
  return true;
}
#endif

Status hwlocXml(const std::string& path, std::string xml, HostSummary* out) {
  std::string note;
#if HWLOC_API_VERSION < 0x00030000
  if (downgradeHwloc3Xml(&xml)) note = ", hwloc 3 format read as hwloc 2";
#endif
  HwlocTopology topo;
  if (hwloc_topology_init(&topo.t) != 0) return systemError("hwloc_topology_init");
  // Keep every I/O object the file has; the default filter would drop them all.
  hwloc_topology_set_io_types_filter(topo.t, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_set_xmlbuffer(topo.t, xml.data(), static_cast<int>(xml.size() + 1)) != 0)
    return makeError(ridgeInvalidArgument, "hwloc cannot read %s as hwloc XML", path.c_str());
  if (hwloc_topology_load(topo.t) != 0)
    return makeError(ridgeInvalidArgument, "hwloc failed to load %s: %s", path.c_str(), std::strerror(errno));
  fromHwloc(topo.t, false, out);
  const char* host = rootInfo(topo.t, "HostName");
  out->hostname = host ? host : "";
  const char* ver = rootInfo(topo.t, "hwlocVersion");
  out->source = "hwloc XML " + path + (ver ? std::string(" (written by hwloc ") + ver + ")" : "") + note;
  return Status::ok();
}

#endif  // RIDGE_HAVE_HWLOC

// ---- NCCL topology files ----------------------------------------------------------------

// Number of bits set in an NCCL affinity mask ("0000ffff,ffffffff": 32-bit hex groups, most
// significant first), OR-ed into `bits` (least significant group first).
void orAffinity(const std::string& mask, std::vector<uint32_t>* bits) {
  std::vector<uint32_t> groups;
  size_t b = 0;
  while (b <= mask.size()) {
    size_t e = mask.find(',', b);
    if (e == std::string::npos) e = mask.size();
    groups.push_back(static_cast<uint32_t>(std::strtoul(mask.substr(b, e - b).c_str(), nullptr, 16)));
    b = e + 1;
  }
  std::reverse(groups.begin(), groups.end());
  if (bits->size() < groups.size()) bits->resize(groups.size(), 0);
  for (size_t i = 0; i < groups.size(); ++i) (*bits)[i] |= groups[i];
}

uint32_t hexAttr(const XmlElement& e, const char* key) {
  const std::string* v = e.attribute(key);
  return v ? static_cast<uint32_t>(std::strtoul(v->c_str(), nullptr, 16)) : 0;
}

void collectNetNames(const XmlElement& e, std::vector<std::string>* names) {
  for (const XmlElement& c : e.children) {
    if (c.name == "net") {
      if (const std::string* n = c.attribute("name")) names->push_back(*n);
    }
    collectNetNames(c, names);
  }
}

struct NcclWalk {
  HostSummary* out;
  std::set<std::string> numaIds;
  int cpusWithoutId = 0;
  std::vector<uint32_t> affinity;

  void visit(const XmlElement& e, bool underNicPci) {
    if (e.name == "cpu") {
      if (const std::string* id = e.attribute("numaid"))
        numaIds.insert(*id);
      else
        ++cpusWithoutId;
      if (const std::string* a = e.attribute("affinity")) orAffinity(*a, &affinity);
    } else if (e.name == "pci") {
      // class is 24 bits (0x030200): base class, subclass, programming interface.
      uint16_t classId = static_cast<uint16_t>(hexAttr(e, "class") >> 8);
      uint16_t vendor = static_cast<uint16_t>(hexAttr(e, "vendor"));
      uint16_t device = static_cast<uint16_t>(hexAttr(e, "device"));
      bool gpu = topo::isGpuClass(classId, vendor) || (classId == 0 && hasChild(e, "gpu"));
      bool nic = topo::isNicClass(classId);
      if (gpu || nic) {
        const std::string* busId = e.attribute("busid");
        const std::string* speed = e.attribute("link_speed");
        const std::string* width = e.attribute("link_width");
        std::string link =
            topo::pcieLinkText(width ? std::atoi(width->c_str()) : 0, speed ? topo::parseGts(*speed) : 0);
        std::vector<std::string> names;
        if (nic) collectNetNames(e, &names);
        if (gpu) {
          for (const XmlElement& c : e.children) {
            if (const std::string* dev = c.name == "gpu" ? c.attribute("dev") : nullptr)
              names.push_back("gpu" + *dev);
          }
        }
        std::string line = topo::describePciDevice(busId ? *busId : "?", vendor, device, "", "", names, link);
        addDevice(out, gpu, std::move(line));
      }
      for (const XmlElement& c : e.children) visit(c, underNicPci || nic);
      return;
    } else if (e.name == "nic" && !underNicPci) {
      // A NIC with no PCI path (virtual or not detected): one per <net>.
      std::vector<std::string> names;
      collectNetNames(e, &names);
      for (const std::string& n : names) {
        ++out->nics;
        out->nicNames.push_back(n + " (no PCI path)");
      }
      return;
    }
    for (const XmlElement& c : e.children) visit(c, underNicPci);
  }

  static bool hasChild(const XmlElement& e, const char* name) {
    for (const XmlElement& c : e.children) {
      if (c.name == name) return true;
    }
    return false;
  }
};

Status ncclTopoXml(const std::string& path, const XmlElement& root, HostSummary* out) {
  NcclWalk walk{out, {}, 0, {}};
  walk.visit(root, false);
  int pus = 0;
  for (uint32_t w : walk.affinity) pus += __builtin_popcount(w);
  out->numaNodes = static_cast<int>(walk.numaIds.size()) + walk.cpusWithoutId;
  out->pus = pus > 0 ? pus : -1;
  out->packages = -1;  // NCCL files describe NUMA nodes, not sockets or cores
  out->cores = -1;
  if (out->numaNodes == 0)
    return makeError(ridgeInvalidArgument, "%s: NCCL topology file with no <cpu> element", path.c_str());
  out->source = "NCCL topology XML " + path;
  return Status::ok();
}

// What kind of XML a topology file is, judged by its root element.
enum class XmlKind { Hwloc, NcclTopology, NcclGraph, Unknown };

XmlKind sniffXml(const std::string& text, std::string* rootName) {
  size_t p = 0;
  while (true) {
    p = text.find('<', p);
    if (p == std::string::npos) return XmlKind::Unknown;
    if (text.compare(p, 2, "<?") == 0 || text.compare(p, 2, "<!") == 0) {
      // Comments may contain '>', so skip them by their own terminator.
      size_t e = text.compare(p, 4, "<!--") == 0 ? text.find("-->", p) : text.find('>', p);
      if (e == std::string::npos) return XmlKind::Unknown;
      p = e + 1;
      continue;
    }
    size_t e = p + 1;
    while (e < text.size() && (std::isalnum(static_cast<unsigned char>(text[e])) || text[e] == '_')) ++e;
    *rootName = text.substr(p + 1, e - p - 1);
    if (*rootName == "topology") return XmlKind::Hwloc;
    if (*rootName == "system") return XmlKind::NcclTopology;
    if (*rootName == "graphs") return XmlKind::NcclGraph;
    return XmlKind::Unknown;
  }
}

}  // namespace

// ---- Public entry points ------------------------------------------------------------------

Status summarizeThisHostSysfs(HostSummary* out) {
  auto start = Clock::now();
  *out = HostSummary();
  out->hostname = thisHostName();
  RIDGE_TRY(sysfsSummary(out));
#ifdef RIDGE_HAVE_HWLOC
  out->source = "sysfs";
#else
  out->source = "sysfs fallback (hwloc not built)";
#endif
  out->discoveryMs = msSince(start);
  return Status::ok();
}

Status summarizeThisHost(HostSummary* out) {
#ifdef RIDGE_HAVE_HWLOC
  auto start = Clock::now();
  *out = HostSummary();
  out->hostname = thisHostName();
  Status s = hwlocThisHost(out);
  if (s.isOk()) {
    out->discoveryMs = msSince(start);
    return s;
  }
  RIDGE_WARN("hwloc discovery failed (%s); using /proc and /sys", s.message().c_str());
  RIDGE_TRY(summarizeThisHostSysfs(out));
  out->source = "sysfs fallback (hwloc failed)";
  return Status::ok();
#else
  return summarizeThisHostSysfs(out);
#endif
}

Status summarizeHwlocXml(const std::string& path, HostSummary* out) {
  auto start = Clock::now();
  *out = HostSummary();
  std::string text;
  RIDGE_TRY(topo::readTextFile(path, &text));
  std::string rootName;
  switch (sniffXml(text, &rootName)) {
    case XmlKind::Hwloc: {
#ifdef RIDGE_HAVE_HWLOC
      RIDGE_TRY(hwlocXml(path, std::move(text), out));
      break;
#else
      return makeError(ridgeInvalidUsage, "%s is an hwloc XML file, but this Ridge was built without hwloc",
                       path.c_str());
#endif
    }
    case XmlKind::NcclTopology: {
      XmlElement root;
      RIDGE_TRY(topo::parseXml(text, path, &root));
      RIDGE_TRY(ncclTopoXml(path, root, out));
      break;
    }
    case XmlKind::NcclGraph:
      return makeError(ridgeInvalidArgument,
                       "%s is an NCCL graph file (<graphs>): it lists channels, not a machine; "
                       "give an hwloc XML (lstopo --of xml) or NCCL topology file (<system>)",
                       path.c_str());
    case XmlKind::Unknown:
      return makeError(ridgeInvalidArgument,
                       "%s: root element <%s> is neither hwloc XML (<topology>) nor an NCCL "
                       "topology file (<system>)",
                       path.c_str(), rootName.c_str());
  }
  out->discoveryMs = msSince(start);
  return Status::ok();
}

namespace {

std::string compactCount(int n) {
  return n < 0 ? std::string("?") : std::to_string(n);
}

}  // namespace

std::string summaryToCompactString(const HostSummary& s) {
  std::string counts = " pkg=" + compactCount(s.packages) + " numa=" + compactCount(s.numaNodes) +
                       " core=" + compactCount(s.cores) + " pu=" + compactCount(s.pus) +
                       " gpu=" + compactCount(s.gpus) + " nic=" + compactCount(s.nics);
  const std::string prefix = "ridge-topo1 host=";
  // Hostnames have no spaces, but a file may say anything: keep the line one token per field.
  std::string host = s.hostname.empty() ? "-" : s.hostname;
  for (char& c : host) {
    if (c == ' ' || c == '=' || c == '\t' || c == '\n' || static_cast<unsigned char>(c) < 0x20) c = '_';
  }
  size_t room = kCompactSummaryMax - prefix.size() - counts.size();
  if (host.size() > room) host.resize(room);
  return prefix + host + counts;
}

Status parseCompactSummary(const std::string& text, HostSummary* out) {
  *out = HostSummary();
  if (text.rfind("ridge-topo1 ", 0) != 0)
    return makeError(ridgeInvalidArgument, "not a Ridge topology summary: '%.40s'", text.c_str());
  struct Field {
    const char* key;
    int* value;
  } fields[] = {{"pkg", &out->packages}, {"numa", &out->numaNodes}, {"core", &out->cores},
                {"pu", &out->pus},       {"gpu", &out->gpus},       {"nic", &out->nics}};
  size_t p = 12;
  while (p < text.size()) {
    size_t e = text.find(' ', p);
    if (e == std::string::npos) e = text.size();
    std::string tok = text.substr(p, e - p);
    p = e + 1;
    size_t eq = tok.find('=');
    if (eq == std::string::npos) continue;
    std::string key = tok.substr(0, eq), val = tok.substr(eq + 1);
    if (key == "host") {
      out->hostname = val == "-" ? "" : val;
      continue;
    }
    for (auto& f : fields) {
      if (key == f.key) *f.value = val == "?" ? -1 : std::atoi(val.c_str());
    }
    // Unknown keys are skipped so that a newer peer can add fields.
  }
  out->source = "compact summary";
  return Status::ok();
}

}  // namespace ridge
