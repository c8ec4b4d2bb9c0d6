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
#include "topo/summary_internal.h"
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

// Shared with summary_files.cpp through summary_internal.h (declared there: Clock, msSince,
// addDevice, HwlocTopology, fromHwloc, rootInfo).
namespace summary_internal {

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

#endif  // RIDGE_HAVE_HWLOC

}  // namespace summary_internal

using namespace summary_internal;

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
