// The summaries of topology files only ridge-topo prints (`ridge-topo summary --xml F`,
// summary.h summarizeHwlocXml): hwloc XML and NCCL topology files. Part of ridge_tooling, not
// libridge, which summarizes only the machine it runs on (summary.cpp).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/log.h"
#include "topo/pci.h"
#include "topo/summary.h"
#include "topo/summary_internal.h"
#include "topo/sysfs.h"
#include "topo/xml.h"

namespace ridge {

using topo::XmlElement;

namespace summary_internal {
namespace {

#ifdef RIDGE_HAVE_HWLOC

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
}  // namespace summary_internal

using namespace summary_internal;

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

}  // namespace ridge
