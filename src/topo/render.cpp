#include "topo/render.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/json.h"

namespace ridge::topo {

namespace {

// ANSI colours, used only when RenderOptions::color is set.
constexpr const char* kReset = "\033[0m";
constexpr const char* kBold = "\033[1m";
constexpr const char* kGreen = "\033[32m";
constexpr const char* kYellow = "\033[33m";
constexpr const char* kBlue = "\033[34m";
constexpr const char* kMagenta = "\033[35m";
constexpr const char* kCyan = "\033[36m";
constexpr const char* kRed = "\033[31m";
constexpr const char* kDim = "\033[2m";

std::string paint(const RenderOptions& o, const char* colour, const std::string& text) {
  return o.color && colour ? colour + text + kReset : text;
}

std::string padRight(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string padLeft(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

// Rows of cells printed with every column padded to its widest cell; a row's colour (if any)
// applies to its first cell, after padding so that escape codes do not skew the widths.
class Table {
 public:
  void row(std::vector<std::string> cells, const char* colour = nullptr) {
    rows_.push_back({std::move(cells), colour});
  }
  std::string str(const RenderOptions& o, const std::vector<bool>& rightAligned = {}) const {
    std::vector<size_t> width;
    for (const Row& r : rows_) {
      if (r.cells.size() < 2) continue;  // one-cell rows are headings, not part of the grid
      if (width.size() < r.cells.size()) width.resize(r.cells.size(), 0);
      for (size_t i = 0; i < r.cells.size(); ++i) width[i] = std::max(width[i], r.cells[i].size());
    }
    std::string out;
    for (const Row& r : rows_) {
      std::string line;
      for (size_t i = 0; i < r.cells.size(); ++i) {
        const bool last = i + 1 == r.cells.size();
        std::string cell = r.cells.size() < 2                             ? r.cells[i]
                           : (i < rightAligned.size() && rightAligned[i]) ? padLeft(r.cells[i], width[i])
                           : last                                         ? r.cells[i]
                                                                          : padRight(r.cells[i], width[i]);
        if (i == 0) cell = paint(o, r.colour, cell);
        line += (i ? "  " : "") + cell;
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
    }
    return out;
  }

 private:
  struct Row {
    std::vector<std::string> cells;
    const char* colour;
  };
  std::vector<Row> rows_;
};

bool isSwitchUpstream(const Topology& t, int id) {
  const Node& n = t.node(id);
  return n.kind == NodeKind::PciBridge && n.pciSwitch == id && n.parent >= 0 &&
         t.node(n.parent).kind == NodeKind::PciBridge;
}

// Root ports and downstream ports are folded into their host bridge or switch.
bool isFoldedBridge(const Topology& t, int id) {
  return t.node(id).kind == NodeKind::PciBridge && !isSwitchUpstream(t, id);
}

bool isEndpointOfInterest(NodeKind k) {
  return k == NodeKind::Gpu || k == NodeKind::Nic || k == NodeKind::Nvme || k == NodeKind::NvSwitch;
}

// Which nodes have a GPU, NIC, NVMe drive or NVSwitch at or below them.
std::vector<bool> interestingNodes(const Topology& t) {
  std::vector<bool> mark(t.nodes().size(), false);
  for (size_t i = 0; i < t.nodes().size(); ++i) {
    if (!isEndpointOfInterest(t.nodes()[i].kind)) continue;
    for (int cur = static_cast<int>(i); cur >= 0 && !mark[static_cast<size_t>(cur)]; cur = t.node(cur).parent)
      mark[static_cast<size_t>(cur)] = true;
  }
  return mark;
}

// PCI functions in a subtree that holds nothing of interest (bridges not counted).
void collectOthers(const Topology& t, int id, std::vector<int>* out) {
  const Node& n = t.node(id);
  if (n.kind == NodeKind::PciDevice) out->push_back(id);
  for (int c : n.children) collectOthers(t, c, out);
}

std::string othersLine(const Topology& t, const std::vector<int>& others) {
  std::string s = format("+ %zu other PCI function%s", others.size(), others.size() == 1 ? "" : "s");
  std::string list;
  for (size_t i = 0; i < others.size() && i < 4; ++i) {
    const Node& n = t.node(others[i]);
    list += (i ? ", " : "") + (n.busId.empty() ? n.name : n.busId);
    if (n.pciClass) list += format(" [%04x]", n.pciClass > 0xffff ? n.pciClass >> 8 : n.pciClass);
  }
  if (others.size() > 4) list += ", ...";
  return list.empty() ? s : s + ": " + list;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const std::string& x : v)
    if (!x.empty()) s += (s.empty() ? "" : sep) + x;
  return s;
}

// The link a node hangs from (its tree edge).
const Link* parentLink(const Topology& t, int id) {
  const int p = t.node(id).parent;
  if (p < 0) return nullptr;
  const int li = t.linkBetween(p, id);
  return li < 0 ? nullptr : &t.link(li);
}

std::string nodeLinkText(const Topology& t, int id) {
  const Link* l = parentLink(t, id);
  return l ? linkLabel(*l) : "";
}

const char* colourOf(NodeKind k) {
  switch (k) {
    case NodeKind::Gpu: return kGreen;
    case NodeKind::Nic: return kCyan;
    case NodeKind::Nvme: return kMagenta;
    case NodeKind::PciBridge: return kYellow;
    case NodeKind::Package: return kBold;
    case NodeKind::Numa: return kBlue;
    case NodeKind::HostBridge: return kDim;
    default: return nullptr;
  }
}

std::string deviceDetails(const Node& n) {
  std::vector<std::string> parts;
  if (n.kind == NodeKind::Gpu && n.smVersion) parts.push_back(format("sm%d", n.smVersion));
  if (n.kind == NodeKind::Nic && n.nicDeviceMemory) parts.push_back("on-NIC memory");
  return joined(parts, ", ");
}

class TreePrinter {
 public:
  TreePrinter(const Topology& t, const RenderOptions& o) : t_(t), o_(o), interesting_(interestingNodes(t)) {}

  std::string run() {
    const Node& m = t_.node(t_.root());
    std::string out = paint(o_, kBold, m.name.empty() ? "machine" : m.name);
    if (!t_.source.empty()) out += "  (" + t_.source + ")";
    out += "\n";
    children(t_.root(), 1);
    out += table_.str(o_);
    out += fabric();
    return out;
  }

 private:
  void line(int depth, const std::string& first, std::vector<std::string> rest = {},
            const char* colour = nullptr) {
    std::vector<std::string> cells{std::string(static_cast<size_t>(depth) * 2, ' ') + first};
    for (std::string& s : rest) cells.push_back(std::move(s));
    table_.row(std::move(cells), colour);
  }

  // Children of `id` at `depth`: interesting ones in full, folded bridges flattened, the rest
  // summarized in one line.
  void children(int id, int depth) {
    std::vector<int> others;
    visitChildren(id, depth, &others);
    if (!others.empty()) line(depth, othersLine(t_, others), {}, kDim);
  }

  void visitChildren(int id, int depth, std::vector<int>* others) {
    for (int c : t_.node(id).children) {
      const Node& n = t_.node(c);
      if (n.kind == NodeKind::NvSwitch) continue;  // in the fabric section
      if (!interesting_[static_cast<size_t>(c)] && n.kind != NodeKind::Package && n.kind != NodeKind::Numa) {
        collectOthers(t_, c, others);
        continue;
      }
      if (isFoldedBridge(t_, c)) {
        visitChildren(c, depth, others);
        continue;
      }
      node(c, depth);
    }
  }

  void node(int id, int depth) {
    const Node& n = t_.node(id);
    switch (n.kind) {
      case NodeKind::Package: line(depth, n.name + (n.model.empty() ? "" : "  " + n.model), {}, kBold); break;
      case NodeKind::Numa: line(depth, n.name, {}, kBlue); break;
      case NodeKind::HostBridge: line(depth, n.name, {}, kDim); break;
      case NodeKind::PciBridge:
        line(depth, n.name.rfind("PCIe switch", 0) == 0 ? n.name : "PCIe switch " + n.busId,
             {"", "", "", "", nodeLinkText(t_, id)}, kYellow);
        break;
      case NodeKind::Gpu:
      case NodeKind::Nic:
      case NodeKind::Nvme:
      case NodeKind::PciDevice:
        line(depth, n.name,
             {n.model, n.busId, joined(n.osNames, " "), deviceDetails(n), nodeLinkText(t_, id)},
             colourOf(n.kind));
        for (const NicPort& p : n.ports) {
          std::vector<std::string> what;
          if (!p.netdev.empty() && p.netdev != p.name) what.push_back(p.netdev);
          if (!p.state.empty()) what.push_back(p.state);
          if (!p.linkLayer.empty()) what.push_back(p.linkLayer);
          if (p.rateGbps > 0) what.push_back(number(p.rateGbps) + " Gb/s");
          line(depth + 1, "port " + p.name, {joined(what, " ")});
        }
        break;
      default: line(depth, n.name); break;
    }
    if (n.kind != NodeKind::Gpu && n.kind != NodeKind::Nic && n.kind != NodeKind::Nvme)
      children(id, depth + 1);
  }

  std::string fabric() {
    std::string out;
    const std::vector<int> switches = t_.nodesOfKind(NodeKind::NvSwitch);
    std::vector<std::string> lines;
    if (!switches.empty()) {
      // Lanes and bandwidth per GPU over the whole fabric.
      std::map<int, std::pair<int, double>> perGpu;
      for (int s : switches)
        for (int li : t_.node(s).links) {
          const Link& l = t_.link(li);
          const int g = l.other(s);
          if (l.kind != LinkKind::NvLink || t_.node(g).kind != NodeKind::Gpu) continue;
          perGpu[g].first += l.nvlinkCount;
          perGpu[g].second += l.bandwidthGBs;
        }
      std::set<std::pair<int, double>> shapes;
      for (auto& kv : perGpu) shapes.insert(kv.second);
      std::string per;
      if (shapes.size() == 1)
        per = format("every GPU %d lanes, %s GB/s", shapes.begin()->first,
                     number(shapes.begin()->second).c_str());
      else
        for (auto& kv : perGpu)
          per += format("%s%s %d lanes %s GB/s", per.empty() ? "" : "; ", t_.node(kv.first).name.c_str(),
                        kv.second.first, number(kv.second.second).c_str());
      lines.push_back(
          format("NVSwitch fabric: %zu switches (%s), %zu GPUs: %s", switches.size(),
                 t_.node(switches[0]).model.empty() ? "NVSwitch" : t_.node(switches[0]).model.c_str(),
                 perGpu.size(), per.c_str()));
    }
    for (const Link& l : t_.links()) {
      if (l.kind == LinkKind::NvLink && t_.node(l.a).kind == NodeKind::Gpu &&
          t_.node(l.b).kind == NodeKind::Gpu)
        lines.push_back(format("NVLink %s - %s: %s", t_.node(l.a).name.c_str(), t_.node(l.b).name.c_str(),
                               linkLabel(l).c_str()));
      if (l.kind == LinkKind::NvLink && t_.node(l.b).kind == NodeKind::Gpu &&
          (t_.node(l.a).kind == NodeKind::Package || t_.node(l.a).kind == NodeKind::Machine))
        lines.push_back(format("NVLink %s - CPU %s: %s", t_.node(l.b).name.c_str(), t_.node(l.a).name.c_str(),
                               linkLabel(l).c_str()));
      if (l.kind == LinkKind::Socket)
        lines.push_back(format("Socket link %s - %s: %s", t_.node(l.a).name.c_str(),
                               t_.node(l.b).name.c_str(), linkLabel(l).c_str()));
    }
    for (const std::string& s : lines) out += s + "\n";
    return out;
  }

  const Topology& t_;
  const RenderOptions& o_;
  std::vector<bool> interesting_;
  Table table_;
};

std::vector<int> matrixDevices(const Topology& t) {
  std::vector<int> ids = t.gpus();
  for (int n : t.nics()) ids.push_back(n);
  return ids;
}

std::string classText(const Path& p, bool nccl) {
  return nccl ? ncclClassName(p.nccl) : smiClassName(p.smi, p.nvlinks);
}

const char* classColour(const Path& p) {
  switch (p.smi) {
    case SmiClass::X: return nullptr;
    case SmiClass::NV: return kGreen;
    case SmiClass::PIX:
    case SmiClass::PXB: return kCyan;
    case SmiClass::PHB:
    case SmiClass::NODE: return kYellow;
    case SmiClass::SYS: return kRed;
  }
  return nullptr;
}

int nodeIndexOf(const Topology& t, int id) {
  return id < 0 ? -1 : t.node(id).index;
}

}  // namespace

std::string number(double v) {
  if (!std::isfinite(v)) return "-";
  std::string s = format("%.2f", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string linkLabel(const Link& l) {
  std::vector<std::string> parts;
  if (l.kind == LinkKind::Pcie && l.pcieGen > 0)
    parts.push_back(l.pcieWidth > 0 ? format("Gen%d x%d", l.pcieGen, l.pcieWidth)
                                    : format("Gen%d", l.pcieGen));
  if (l.kind == LinkKind::NvLink && l.nvlinkCount > 0) parts.push_back(format("NV%d", l.nvlinkCount));
  if (l.bandwidthGBs > 0) parts.push_back(number(l.bandwidthGBs) + " GB/s");
  return joined(parts, " ");
}

std::string renderTree(const Topology& t, const RenderOptions& o) {
  TreePrinter p(t, o);
  return p.run();
}

std::string renderMatrix(const Topology& t, const RenderOptions& o) {
  const std::vector<int> ids = matrixDevices(t);
  std::string out;
  if (ids.empty()) return "no GPUs or NICs in this topology\n";
  // Cells are padded by hand (not Table) so that each one can carry its class colour.
  std::vector<std::string> header{""};
  for (int id : ids) header.push_back(t.node(id).name);
  // nvidia-smi's affinity columns, then the socket.
  header.push_back("CPU Affinity");
  header.push_back("NUMA Affinity");
  header.push_back("Socket");
  std::vector<std::vector<std::string>> cells{header};
  std::vector<std::vector<const char*>> colours{std::vector<const char*>(header.size(), nullptr)};
  for (int r : ids) {
    std::vector<std::string> row{t.node(r).name};
    std::vector<const char*> rowColours{colourOf(t.node(r).kind)};
    for (int c : ids) {
      Path p = t.path(r, c);
      row.push_back(classText(p, o.nccl));
      rowColours.push_back(classColour(p));
    }
    const int pkg = nodeIndexOf(t, t.node(r).package), numa = nodeIndexOf(t, t.node(r).numa);
    const std::string cpus = t.node(r).numa < 0 ? "" : t.node(t.node(r).numa).cpus;
    row.push_back(cpus.empty() ? "N/A" : cpus);
    row.push_back(numa < 0 ? "N/A" : std::to_string(numa));
    row.push_back(pkg < 0 ? "N/A" : std::to_string(pkg));
    rowColours.insert(rowColours.end(), 3, nullptr);
    cells.push_back(row);
    colours.push_back(rowColours);
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : cells)
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  for (size_t r = 0; r < cells.size(); ++r) {
    std::string line;
    for (size_t i = 0; i < cells[r].size(); ++i) {
      std::string cell =
          i == 0 ? padRight(cells[r][i], width[i]) : padRight(cells[r][i], std::max<size_t>(width[i], 4));
      line += (i ? "  " : "") + paint(o, r == 0 ? kBold : colours[r][i], cell);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  out += "\nLegend";
  out +=
      o.nccl ? " (NCCL's path classes, best to worst):\n" : " (nvidia-smi topo -m classes, best to worst):\n";
  if (o.nccl) {
    out +=
        "  LOC  the device itself\n"
        "  NVL  NVLink, directly or through NVSwitches\n"
        "  NVB  NVLink through one intermediate GPU\n"
        "  PIX  at most one PCIe switch between the two\n"
        "  PXB  several PCIe switches, not through a host bridge\n"
        "  PHB  through a PCIe host bridge (the CPU), within one NUMA node\n"
        "  SYS  across NUMA nodes or the inter-socket link\n";
  } else {
    out +=
        "  X     the device itself\n"
        "  NV#   NVLink with # lanes (directly or through NVSwitches)\n"
        "  PIX   at most one PCIe switch between the two\n"
        "  PXB   several PCIe switches, not through a host bridge\n"
        "  PHB   through one PCIe host bridge (the CPU's root complex)\n"
        "  NODE  between host bridges within one NUMA node\n"
        "  SYS   across NUMA nodes or the inter-socket link (UPI, xGMI)\n";
  }
  out +=
      "  CPU Affinity, NUMA Affinity: the CPUs and the NUMA node the device hangs from (N/A: not known\n"
      "  from this source); Socket: its package\n";
  const std::vector<int> nics = t.nics();
  if (!nics.empty()) {
    out += "\nNICs:\n";
    for (int n : nics) {
      const Node& nd = t.node(n);
      out += "  " + nd.name + ": " + joined(nd.osNames, ", ");
      if (!nd.model.empty()) out += " (" + nd.model + ")";
      out += "\n";
    }
  }
  return out;
}

std::string matrixJson(const Topology& t) {
  const std::vector<int> ids = matrixDevices(t);
  json::Value doc = json::Value::object();
  json::Value& devices = doc.set("devices", json::Value::array());
  for (int id : ids) {
    const Node& n = t.node(id);
    json::Value& d = devices.push(json::Value::object());
    d.set("name", n.name);
    d.set("kind", nodeKindName(n.kind));
    d.set("busId", n.busId);
    json::Value& os = d.set("osNames", json::Value::array());
    for (const std::string& s : n.osNames) os.push(s);
    d.set("package", nodeIndexOf(t, n.package));
    d.set("numa", nodeIndexOf(t, n.numa));
    if (n.numa >= 0 && !t.node(n.numa).cpus.empty()) d.set("cpuAffinity", t.node(n.numa).cpus);
  }
  json::Value& smi = doc.set("smi", json::Value::array());
  json::Value& nccl = doc.set("nccl", json::Value::array());
  json::Value& bw = doc.set("bandwidthGBs", json::Value::array());
  for (int r : ids) {
    json::Value& s = smi.push(json::Value::array());
    json::Value& n = nccl.push(json::Value::array());
    json::Value& b = bw.push(json::Value::array());
    for (int c : ids) {
      Path p = t.path(r, c);
      s.push(smiClassName(p.smi, p.nvlinks));
      n.push(ncclClassName(p.nccl));
      b.push(r == c ? json::Value() : json::Value(p.bandwidthGBs));
    }
  }
  return json::write(doc, 2) + "\n";
}

namespace {

// Index of the link with the smallest known bandwidth (the first one on a tie), -1 if none.
int bottleneckHop(const Topology& t, const Path& p) {
  int best = -1;
  for (size_t i = 0; i < p.links.size(); ++i) {
    const double bw = p.links[i] < 0 ? 0 : t.link(p.links[i]).bandwidthGBs;
    if (bw > 0 && (best < 0 || bw < t.link(p.links[static_cast<size_t>(best)]).bandwidthGBs))
      best = static_cast<int>(i);
  }
  return best;
}

std::string yesNo(bool b) {
  return b ? "yes" : "no";
}

}  // namespace

std::string renderPath(const Topology& t, int a, int b, const RenderOptions& o) {
  const Path p = t.path(a, b);
  std::string out =
      format("%s -> %s: nvidia-smi %s, NCCL %s\n", t.node(a).name.c_str(), t.node(b).name.c_str(),
             smiClassName(p.smi, p.nvlinks).c_str(), ncclClassName(p.nccl));
  if (p.links.empty()) return out + "  (same device)\n";
  const int worst = bottleneckHop(t, p);
  Table table;
  table.row({"hop", "from", "to", "kind", "link", "GB/s", "ns"});
  for (size_t i = 0; i < p.links.size(); ++i) {
    const int li = p.links[i];
    const Link* l = li < 0 ? nullptr : &t.link(li);
    std::string linkText;
    if (l && l->kind == LinkKind::Pcie && l->pcieGen > 0)
      linkText = format("Gen%d x%d", l->pcieGen, l->pcieWidth);
    if (l && l->kind == LinkKind::NvLink && l->nvlinkCount > 0) linkText = format("%d lanes", l->nvlinkCount);
    table.row({std::to_string(i + 1), t.node(p.nodes[i]).name, t.node(p.nodes[i + 1]).name,
               l ? linkKindName(l->kind) : "?", linkText,
               l && l->bandwidthGBs > 0 ? number(l->bandwidthGBs) : "-", l ? number(l->latencyNs) : "-"},
              static_cast<int>(i) == worst ? kRed : nullptr);
  }
  out += table.str(o, {true, false, false, false, false, true, true});
  // Through NVSwitches the path's bandwidth adds up every switch's lanes; say so.
  if (worst >= 0 && p.bandwidthGBs > t.link(p.links[static_cast<size_t>(worst)]).bandwidthGBs + 1e-9)
    out += format("bandwidth: %s GB/s (%d NVLink lanes over every NVSwitch both GPUs reach)\n",
                  number(p.bandwidthGBs).c_str(), p.nvlinks);
  else if (worst >= 0)
    out += format("bottleneck: %s GB/s at hop %d (%s %s - %s)\n", number(p.bandwidthGBs).c_str(), worst + 1,
                  linkKindName(t.link(p.links[static_cast<size_t>(worst)]).kind),
                  t.node(p.nodes[static_cast<size_t>(worst)]).name.c_str(),
                  t.node(p.nodes[static_cast<size_t>(worst) + 1]).name.c_str());
  else
    out += "bottleneck: unknown (no link on the path has a bandwidth)\n";
  out += format(
      "latency: %s ns; bridge units (switches, root ports): %d; through a host bridge: %s; across "
      "NUMA/socket: %s\n",
      number(p.latencyNs).c_str(), p.bridges, yesNo(p.crossesHostBridge).c_str(),
      yesNo(p.crossesSocket).c_str());
  return out;
}

std::string pathJson(const Topology& t, int a, int b) {
  const Path p = t.path(a, b);
  json::Value doc = json::Value::object();
  doc.set("from", t.node(a).name);
  doc.set("to", t.node(b).name);
  doc.set("smi", smiClassName(p.smi, p.nvlinks));
  doc.set("nccl", ncclClassName(p.nccl));
  doc.set("bandwidthGBs", p.bandwidthGBs);
  doc.set("latencyNs", p.latencyNs);
  doc.set("nvlinks", p.nvlinks);
  doc.set("bridges", p.bridges);
  doc.set("crossesHostBridge", p.crossesHostBridge);
  doc.set("crossesSocket", p.crossesSocket);
  const int worst = bottleneckHop(t, p);
  doc.set("bottleneckHop", worst < 0 ? json::Value() : json::Value(worst));
  json::Value& hops = doc.set("hops", json::Value::array());
  for (size_t i = 0; i < p.links.size(); ++i) {
    json::Value& h = hops.push(json::Value::object());
    h.set("from", t.node(p.nodes[i]).name);
    h.set("to", t.node(p.nodes[i + 1]).name);
    if (p.links[i] < 0) continue;
    const Link& l = t.link(p.links[i]);
    h.set("kind", linkKindName(l.kind));
    h.set("bandwidthGBs", l.bandwidthGBs);
    h.set("latencyNs", l.latencyNs);
    if (l.pcieGen) h.set("pcieGen", l.pcieGen);
    if (l.pcieWidth) h.set("pcieWidth", l.pcieWidth);
    if (l.nvlinkCount) h.set("nvlinkCount", l.nvlinkCount);
  }
  return json::write(doc, 2) + "\n";
}

std::vector<DataPathMark> nearestNics(const Topology& t) {
  std::vector<DataPathMark> out;
  const std::vector<int> nics = t.nics();
  if (nics.empty()) return out;
  for (int g : t.gpus()) {
    int best = -1;
    Path bestPath;
    for (int n : nics) {
      Path p = t.path(g, n);
      if (best < 0 || p.smi < bestPath.smi ||
          (p.smi == bestPath.smi && p.links.size() < bestPath.links.size()))
        best = n, bestPath = p;
    }
    out.push_back({g, best, smiClassName(bestPath.smi, bestPath.nvlinks)});
  }
  return out;
}

// ---- Graphviz ---------------------------------------------------------------------------

namespace {

std::string dotEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// "Gen5 x16 48 GB/s" -> "Gen5 x16\n48 GB/s": narrower edge labels keep the drawing compact.
std::string twoLines(const std::string& label) {
  const size_t gb = label.find(" GB/s");
  if (gb == std::string::npos) return label;
  const size_t cut = label.rfind(' ', gb - 1);
  if (cut == std::string::npos) return label;
  return label.substr(0, cut) + "\n" + label.substr(cut + 1);
}

class DotWriter {
 public:
  DotWriter(const Topology& t, const std::vector<DataPathMark>& marks)
      : t_(t), marks_(marks), interesting_(interestingNodes(t)), rep_(t.nodes().size(), -1) {}

  std::string run() {
    chooseVisible();
    markRoutes();
    std::string out = "digraph \"" + dotEscape(t_.name.empty() ? "topology" : t_.name) + "\" {\n";
    out +=
        "  graph [rankdir=TB, newrank=true, ordering=out, nodesep=0.25, ranksep=0.45, "
        "fontname=\"Helvetica\", "
        "fontsize=12, labelloc=t, label=\"" +
        dotEscape(title()) + "\"];\n";
    out += "  node [fontname=\"Helvetica\", fontsize=10, style=\"filled,rounded\", shape=box, penwidth=1];\n";
    out += "  edge [fontname=\"Helvetica\", fontsize=8, arrowhead=none, color=\"#555555\"];\n";
    for (int pkg : t_.nodesOfKind(NodeKind::Package)) out += cluster(pkg);
    // Anything not below a package (a flat file, a machine without packages).
    for (size_t i = 0; i < t_.nodes().size(); ++i) {
      const int id = static_cast<int>(i);
      if (visible(id) && t_.node(id).package < 0 && t_.node(id).kind != NodeKind::Package)
        out += "  " + nodeDecl(id) + "\n";
    }
    out += treeEdges();
    out += socketEdges();
    out += nvlinkFabric();
    out += "}\n";
    return out;
  }

 private:
  bool visible(int id) const { return rep_[static_cast<size_t>(id)] == id; }
  std::string nodeId(int id) const { return "n" + std::to_string(id); }

  std::string title() const {
    std::string s = t_.name.empty() ? "topology" : t_.name;
    if (!t_.source.empty() && t_.source != "preset " + t_.name) s += " (" + t_.source + ")";
    if (!marks_.empty()) s += "\nred: route from each GPU to its chosen NIC";
    return s;
  }

  // Which nodes are drawn, and for each hidden one the drawn node that stands for it.
  void chooseVisible() {
    const int n = static_cast<int>(t_.nodes().size());
    std::map<int, int> numaPerPackage;
    for (int id : t_.nodesOfKind(NodeKind::Numa))
      if (t_.node(id).package >= 0) ++numaPerPackage[t_.node(id).package];
    for (int id = 0; id < n; ++id) {
      const Node& nd = t_.node(id);
      bool show = false;
      switch (nd.kind) {
        case NodeKind::Machine: show = false; break;
        case NodeKind::Package: show = true; break;
        // A package's only NUMA node is drawn as the package itself.
        case NodeKind::Numa:
          show = numaPerPackage[nd.package] > 1 && interesting_[static_cast<size_t>(id)];
          break;
        case NodeKind::HostBridge:
        case NodeKind::Gpu:
        case NodeKind::Nic:
        case NodeKind::Nvme: show = interesting_[static_cast<size_t>(id)]; break;
        case NodeKind::PciBridge:
          show = isSwitchUpstream(t_, id) && interesting_[static_cast<size_t>(id)];
          break;
        case NodeKind::NvSwitch: show = false; break;  // summarized as one fabric node
        case NodeKind::PciDevice: show = false; break;
      }
      if (show) rep_[static_cast<size_t>(id)] = id;
    }
    // Hidden nodes stand for their nearest drawn ancestor (a downstream port for its switch,
    // a root port for its host bridge, a lone NUMA node for its package).
    for (int id = 0; id < n; ++id) {
      if (visible(id)) continue;
      int cur = t_.node(id).parent;
      while (cur >= 0 && !visible(cur)) cur = t_.node(cur).parent;
      if (t_.node(id).kind == NodeKind::Package || t_.node(id).kind == NodeKind::Machine) cur = -1;
      rep_[static_cast<size_t>(id)] = cur;
    }
  }

  // Drawn edges (child -> its drawn parent) that a marked route passes, and the notes of the
  // GPUs and NICs at the ends.
  void markRoutes() {
    for (const DataPathMark& m : marks_) {
      if (m.gpu < 0 || m.nic < 0) continue;
      const Path p = t_.path(m.gpu, m.nic);
      std::vector<int> drawn;
      for (int id : p.nodes) {
        int r = rep_[static_cast<size_t>(id)];
        // Crossing packages: the package node stands for its CPU.
        if (t_.node(id).kind == NodeKind::Package) r = id;
        if (r >= 0 && (drawn.empty() || drawn.back() != r)) drawn.push_back(r);
      }
      for (size_t i = 0; i + 1 < drawn.size(); ++i) routeEdges_.insert(std::minmax(drawn[i], drawn[i + 1]));
      gpuNotes_[m.gpu] = "-> " + t_.node(m.nic).name + (m.note.empty() ? "" : " " + m.note);
    }
  }

  std::string nodeDecl(int id) const {
    const Node& n = t_.node(id);
    std::string label = n.name, attrs;
    auto add = [&](const std::string& s) {
      if (!s.empty()) label += "\n" + s;
    };
    switch (n.kind) {
      case NodeKind::Package:
        add(n.model);
        attrs = "shape=box3d, style=filled, fillcolor=\"#cfe2f3\", color=\"#3d85c6\"";
        break;
      case NodeKind::Numa:
        attrs = "shape=box3d, style=filled, fillcolor=\"#e3eef9\", color=\"#3d85c6\"";
        break;
      case NodeKind::HostBridge:
        label = "Host bridge\n" + n.name.substr(n.name.rfind(' ') + 1);
        attrs = "shape=box, fillcolor=\"#eeeeee\", color=\"#888888\"";
        break;
      case NodeKind::PciBridge:
        label = "PCIe switch\n" + n.busId;
        attrs = "shape=hexagon, style=filled, fillcolor=\"#fff2cc\", color=\"#bf9000\"";
        break;
      case NodeKind::Gpu: {
        add(n.model);
        auto note = gpuNotes_.find(id);
        if (note != gpuNotes_.end()) add(note->second);  // "-> NIC0 gdr-read (PIX)"
        attrs = "shape=box, fillcolor=\"#d9ead3\", color=\"#38761d\", penwidth=1.5";
        break;
      }
      case NodeKind::Nic: {
        std::string os = n.osNames.empty() ? "" : n.osNames[0];
        double rate = 0;
        for (const NicPort& p : n.ports) rate = std::max(rate, p.rateGbps);
        if (rate > 0) os += (os.empty() ? "" : ", ") + number(rate) + "G";
        add(os);
        attrs = "shape=ellipse, style=filled, fillcolor=\"#d0e0e3\", color=\"#134f5c\", penwidth=1.5";
        break;
      }
      case NodeKind::Nvme:
        attrs = "shape=cylinder, style=filled, fillcolor=\"#ead1dc\", color=\"#741b47\"";
        break;
      default: attrs = "shape=box"; break;
    }
    return nodeId(id) + " [label=\"" + dotEscape(label) + "\", " + attrs + "];";
  }

  std::string cluster(int pkg) const {
    std::string out = "  subgraph cluster_" + std::to_string(pkg) + " {\n";
    out += "    label=\"socket " + std::to_string(t_.node(pkg).index) +
           "\"; style=\"rounded,dashed\"; color=\"#3d85c6\";\n";
    for (size_t i = 0; i < t_.nodes().size(); ++i) {
      const int id = static_cast<int>(i);
      if (visible(id) && (id == pkg || t_.node(id).package == pkg)) out += "    " + nodeDecl(id) + "\n";
    }
    out += "  }\n";
    return out;
  }

  std::string edgeAttrs(int a, int b, const std::string& label) const {
    std::string attrs = "label=\"" + dotEscape(label) + "\"";
    if (routeEdges_.count(std::minmax(a, b)))
      attrs += ", color=\"#cc0000\", penwidth=3, fontcolor=\"#cc0000\"";
    return attrs;
  }

  // Each drawn node joined to its drawn parent, labelled with the physical link it hangs from
  // (the edge nearest the child that carries a PCIe generation, else its own).
  std::string treeEdges() const {
    std::string out;
    for (size_t i = 0; i < t_.nodes().size(); ++i) {
      const int id = static_cast<int>(i);
      if (!visible(id) || t_.node(id).kind == NodeKind::Package) continue;
      const int parent = t_.node(id).parent < 0 ? -1 : rep_[static_cast<size_t>(t_.node(id).parent)];
      int drawnParent = parent;
      if (drawnParent < 0 && t_.node(id).package >= 0) drawnParent = t_.node(id).package;
      if (drawnParent < 0) continue;
      std::string label;
      for (int cur = id; cur >= 0 && cur != drawnParent && label.empty(); cur = t_.node(cur).parent) {
        const Link* l = parentLink(t_, cur);
        if (l && l->kind == LinkKind::Pcie && (l->pcieGen > 0 || cur == id)) label = twoLines(linkLabel(*l));
      }
      out += "  " + nodeId(drawnParent) + " -> " + nodeId(id) + " [" + edgeAttrs(drawnParent, id, label) +
             "];\n";
    }
    return out;
  }

  std::string socketEdges() const {
    std::string out;
    for (const Link& l : t_.links()) {
      if (l.kind != LinkKind::Socket) continue;
      std::string attrs = edgeAttrs(l.a, l.b, "socket link\n" + linkLabel(l));
      if (!routeEdges_.count(std::minmax(l.a, l.b))) attrs += ", color=\"#3d85c6\", penwidth=2";
      out += "  " + nodeId(l.a) + " -> " + nodeId(l.b) + " [" + attrs + ", style=bold, constraint=false];\n";
    }
    return out;
  }

  // NVSwitches become one fabric node below the GPUs with an edge per GPU (lanes, GB/s);
  // direct GPU-GPU NVLinks are drawn as they are.
  std::string nvlinkFabric() const {
    std::string out;
    const std::vector<int> switches = t_.nodesOfKind(NodeKind::NvSwitch);
    std::map<int, std::pair<int, double>> perGpu;
    for (int s : switches)
      for (int li : t_.node(s).links) {
        const Link& l = t_.link(li);
        const int g = l.other(s);
        if (l.kind == LinkKind::NvLink && t_.node(g).kind == NodeKind::Gpu) {
          perGpu[g].first += l.nvlinkCount;
          perGpu[g].second += l.bandwidthGBs;
        }
      }
    if (!perGpu.empty()) {
      std::string label =
          format("NVSwitch fabric\n%zu x %s", switches.size(),
                 t_.node(switches[0]).model.empty() ? "NVSwitch" : t_.node(switches[0]).model.c_str());
      out += "  fabric [label=\"" + dotEscape(label) +
             "\", shape=box, style=\"filled,bold\", fillcolor=\"#b6d7a8\", color=\"#38761d\"];\n";
      out += "  { rank=sink; fabric; }\n";
      for (auto& kv : perGpu)
        out += "  " + nodeId(kv.first) + " -> fabric [label=\"" +
               dotEscape(format("NV%d\n%s GB/s", kv.second.first, number(kv.second.second).c_str())) +
               "\", color=\"#38761d\", fontcolor=\"#38761d\", penwidth=2];\n";
    }
    for (const Link& l : t_.links())
      if (l.kind == LinkKind::NvLink && t_.node(l.a).kind == NodeKind::Gpu &&
          t_.node(l.b).kind == NodeKind::Gpu)
        out += "  " + nodeId(l.a) + " -> " + nodeId(l.b) + " [label=\"" + dotEscape(linkLabel(l)) +
               "\", color=\"#38761d\", fontcolor=\"#38761d\", penwidth=2, constraint=false];\n";
    return out;
  }

  const Topology& t_;
  const std::vector<DataPathMark>& marks_;
  std::vector<bool> interesting_;
  std::vector<int> rep_;
  std::set<std::pair<int, int>> routeEdges_;
  std::map<int, std::string> gpuNotes_;
};

}  // namespace

std::string renderDot(const Topology& t, const std::vector<DataPathMark>& marks) {
  DotWriter w(t, marks);
  return w.run();
}

}  // namespace ridge::topo
