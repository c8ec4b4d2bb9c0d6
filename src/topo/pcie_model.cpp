#include "topo/pcie_model.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string_view>
#include <type_traits>

namespace ridge::topo {

namespace {

constexpr double kUnlimited = std::numeric_limits<double>::infinity();

PcieConstantCheck checkOf(PcieConstantCheck c) {
  return c;
}

// The table is built from the same .def as the struct, so the two cannot drift apart.
std::vector<PcieConstantInfo> buildTable() {
  using enum PcieConstantCheck;
  std::vector<PcieConstantInfo> t;
#define RIDGE_PCIE_CONSTANT(key, type, def, lo, hi, check, unit, source)                        \
  t.push_back({#key, std::is_integral_v<PcieConstants::type>, static_cast<double>(def), lo, hi, \
               checkOf(check), unit, source});
#include "topo/pcie_constants.def"
#undef RIDGE_PCIE_CONSTANT
  return t;
}

void setConstant(PcieConstants& c, std::string_view key, double v) {
#define RIDGE_PCIE_CONSTANT(k, type, def, lo, hi, check, unit, source) \
  if (key == #k) {                                                     \
    c.k = static_cast<PcieConstants::type>(v);                         \
    return;                                                            \
  }
#include "topo/pcie_constants.def"
#undef RIDGE_PCIE_CONSTANT
}

double getConstant(const PcieConstants& c, std::string_view key) {
#define RIDGE_PCIE_CONSTANT(k, type, def, lo, hi, check, unit, source) \
  if (key == #k) return static_cast<double>(c.k);
#include "topo/pcie_constants.def"
#undef RIDGE_PCIE_CONSTANT
  return 0;
}

std::string_view trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

bool isPowerOfTwo(double v) {
  auto n = static_cast<int64_t>(v);
  return n > 0 && (n & (n - 1)) == 0;
}

// Range and rule of one value; returns "" when fine, else why not.
std::string checkValue(const PcieConstantInfo& info, double v) {
  if (info.isInteger && v != std::floor(v)) return "expects a whole number";
  if (v < info.minimum || v > info.maximum) {
    return format("is out of range [%g, %g] %s", info.minimum, info.maximum, info.unit);
  }
  switch (info.check) {
    case PcieConstantCheck::None: break;
    case PcieConstantCheck::PowerOfTwo:
      if (!isPowerOfTwo(v)) return "must be a power of two";
      break;
    case PcieConstantCheck::Rcb:
      if (v != 64 && v != 128) return "must be 64 or 128 (the two read completion boundaries)";
      break;
    case PcieConstantCheck::Multiple64:
      if (std::fmod(v, 64) != 0) return "must be a multiple of 64";
      break;
  }
  return "";
}

double hopLatency(const Hop& h, const PcieConstants& c) {
  if (h.latencyNs >= 0) return h.latencyNs;
  switch (h.kind) {
    case HopKind::PcieLink: return c.pcie_link_latency_ns;
    case HopKind::PcieSwitch: return c.pcie_switch_latency_ns;
    case HopKind::RootComplex: return c.root_complex_latency_ns;
    case HopKind::SocketLink: return c.socket_link_latency_ns;
  }
  return 0;
}

// Slowest PCIe link and slowest socket link of a route (kUnlimited when it has none with a
// known rate). Kept apart because only PCIe links carry TLP overhead: the socket-link figure
// is already an effective planning bandwidth.
struct RouteRates {
  double pcie = kUnlimited;
  double socket = kUnlimited;
  bool crossesSocket = false;
};

RouteRates routeRates(const Route& r, const PcieConstants& c) {
  RouteRates out;
  for (const Hop& h : r.hops) {
    if (h.kind == HopKind::PcieLink) {
      double gbs = h.bandwidthGBs > 0 ? h.bandwidthGBs : pcieLinkGBs(c, h.pcieGen, h.pcieWidth);
      if (gbs > 0) out.pcie = std::min(out.pcie, gbs);
    } else if (h.kind == HopKind::SocketLink) {
      out.crossesSocket = true;
      out.socket = std::min(out.socket, h.bandwidthGBs > 0 ? h.bandwidthGBs : c.socket_link_gbs);
    }
  }
  return out;
}

uint64_t ceilDiv(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// Fills the link limit (and names it) from the route's rates and the data efficiency.
void applyLinkLimit(TransferEstimate& e, const RouteRates& rates) {
  double pcie = rates.pcie * e.efficiency;
  e.linkLimitGBs = std::min(pcie, rates.socket);
  e.bandwidthGBs = e.linkLimitGBs;
  if (std::isinf(e.linkLimitGBs)) {
    e.limitedBy = "nothing (no link with a known rate)";
  } else {
    e.limitedBy = rates.socket < pcie ? "socket link" : "PCIe link";
  }
}

void lowerTo(TransferEstimate& e, double limit, const char* why) {
  if (limit > 0 && limit < e.bandwidthGBs) {
    e.bandwidthGBs = limit;
    e.limitedBy = why;
  }
}

}  // namespace

const std::vector<PcieConstantInfo>& pcieConstantTable() {
  static const std::vector<PcieConstantInfo> table = buildTable();
  return table;
}

Status validatePcieConstants(const PcieConstants& c) {
  for (const PcieConstantInfo& info : pcieConstantTable()) {
    double v = getConstant(c, info.key);
    std::string why = checkValue(info, v);
    if (!why.empty()) return Status(ridgeInvalidArgument, format("%s = %g %s", info.key, v, why.c_str()));
  }
  // Completions end on RCB-aligned addresses, so a completer cannot use a size that is not a
  // multiple of its boundary.
  if (c.host_completion_bytes % c.rcb_root_complex_bytes != 0) {
    return Status(ridgeInvalidArgument,
                  format("host_completion_bytes = %lld must be a multiple of rcb_root_complex_bytes = %lld",
                         static_cast<long long>(c.host_completion_bytes),
                         static_cast<long long>(c.rcb_root_complex_bytes)));
  }
  if (c.device_completion_bytes % c.rcb_endpoint_bytes != 0) {
    return Status(ridgeInvalidArgument,
                  format("device_completion_bytes = %lld must be a multiple of rcb_endpoint_bytes = %lld",
                         static_cast<long long>(c.device_completion_bytes),
                         static_cast<long long>(c.rcb_endpoint_bytes)));
  }
  return Status::ok();
}

Status parsePcieConstants(const std::string& text, const std::string& name, PcieConstants* constants) {
  PcieConstants next = *constants;
  std::map<std::string, int, std::less<>> seenAt;  // key -> line, to report repeats
  std::istringstream in(text);
  std::string raw;
  int lineNo = 0;
  auto fail = [&](const std::string& why) {
    return makeError(ridgeInvalidArgument, "PCIe constants %s:%d: %s", name.c_str(), lineNo, why.c_str());
  };
  while (std::getline(in, raw)) {
    ++lineNo;
    std::string_view line = raw;
    if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return fail(format("expected 'key = value', got '%.*s'", static_cast<int>(line.size()), line.data()));
    }
    std::string key(trim(line.substr(0, eq)));
    std::string value(trim(line.substr(eq + 1)));
    const PcieConstantInfo* info = nullptr;
    for (const PcieConstantInfo& i : pcieConstantTable()) {
      if (key == i.key) info = &i;
    }
    if (!info) return fail(format("unknown key '%s' (the keys are listed in docs/topology.md)", key.c_str()));
    if (auto it = seenAt.find(key); it != seenAt.end()) {
      return fail(format("'%s' is already set at line %d", key.c_str(), it->second));
    }
    seenAt.emplace(key, lineNo);
    if (value.empty()) return fail(format("'%s' has no value", key.c_str()));
    errno = 0;
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
      return fail(format("'%s' is not a number: '%s'", key.c_str(), value.c_str()));
    }
    std::string why = checkValue(*info, v);
    if (!why.empty()) return fail(format("%s = %s %s", key.c_str(), value.c_str(), why.c_str()));
    setConstant(next, key, v);
  }
  if (Status s = validatePcieConstants(next); !s) {
    return makeError(ridgeInvalidArgument, "PCIe constants %s: %s", name.c_str(), s.message().c_str());
  }
  *constants = next;
  return Status::ok();
}

Status loadPcieConstants(const std::string& path, PcieConstants* constants) {
  std::ifstream f(path);
  if (!f) return makeError(ridgeInvalidArgument, "PCIe constants %s: cannot open the file", path.c_str());
  std::stringstream text;
  text << f.rdbuf();
  return parsePcieConstants(text.str(), path, constants);
}

double pcieLinkGBs(const PcieConstants& c, int generation, int width) {
  static const int kWidths[] = {1, 2, 4, 8, 12, 16, 32};
  if (std::find(std::begin(kWidths), std::end(kWidths), width) == std::end(kWidths)) return 0;
  double lane = 0;
  switch (generation) {
    case 1: lane = c.pcie_gen1_lane_gbs; break;
    case 2: lane = c.pcie_gen2_lane_gbs; break;
    case 3: lane = c.pcie_gen3_lane_gbs; break;
    case 4: lane = c.pcie_gen4_lane_gbs; break;
    case 5: lane = c.pcie_gen5_lane_gbs; break;
    case 6: lane = c.pcie_gen6_lane_gbs; break;
    default: return 0;
  }
  return lane * width;
}

const char* hopKindName(HopKind k) {
  switch (k) {
    case HopKind::PcieLink: return "PCIe link";
    case HopKind::PcieSwitch: return "PCIe switch";
    case HopKind::RootComplex: return "root complex";
    case HopKind::SocketLink: return "socket link";
  }
  return "?";
}

const char* completerName(Completer c) {
  switch (c) {
    case Completer::HostMemory: return "host memory";
    case Completer::GpuMemory: return "GPU memory";
    case Completer::NicMemory: return "NIC memory";
  }
  return "?";
}

EndpointParams resolveEndpoint(const Route& route, const PcieConstants& c) {
  const EndpointParams& p = route.params;
  bool host = route.completer == Completer::HostMemory;
  EndpointParams r;
  r.mpsBytes = p.mpsBytes > 0 ? p.mpsBytes : static_cast<int>(c.mps_bytes);
  r.mrrsBytes = p.mrrsBytes > 0 ? p.mrrsBytes : static_cast<int>(c.mrrs_bytes);
  r.rcbBytes =
      p.rcbBytes > 0 ? p.rcbBytes : static_cast<int>(host ? c.rcb_root_complex_bytes : c.rcb_endpoint_bytes);
  int completion = p.completionBytes > 0
                       ? p.completionBytes
                       : static_cast<int>(host ? c.host_completion_bytes : c.device_completion_bytes);
  // A completion carries at most MPS bytes, and only the last one of a request may end short
  // of a completion boundary.
  r.completionBytes = std::max(r.rcbBytes, std::min(completion, r.mpsBytes));
  r.maxOutstandingReads =
      p.maxOutstandingReads > 0 ? p.maxOutstandingReads : static_cast<int>(c.nic_read_tags);
  if (p.completerAccessNs >= 0) {
    r.completerAccessNs = p.completerAccessNs;
  } else {
    switch (route.completer) {
      case Completer::HostMemory: r.completerAccessNs = c.host_memory_access_ns; break;
      case Completer::GpuMemory: r.completerAccessNs = c.gpu_memory_access_ns; break;
      case Completer::NicMemory: r.completerAccessNs = c.nic_memory_access_ns; break;
    }
  }
  return r;
}

Route reverseRoute(const Route& route, Completer newCompleter) {
  Route r;
  r.hops.assign(route.hops.rbegin(), route.hops.rend());
  r.completer = newCompleter;
  r.params.mpsBytes = route.params.mpsBytes;
  r.params.mrrsBytes = route.params.mrrsBytes;
  r.params.maxOutstandingReads = route.params.maxOutstandingReads;
  return r;
}

bool isPeerToPeer(const Route& route) {
  if (route.completer == Completer::HostMemory) return false;
  return std::any_of(route.hops.begin(), route.hops.end(),
                     [](const Hop& h) { return h.kind == HopKind::RootComplex; });
}

double traversalNs(const Route& route, const PcieConstants& c) {
  double ns = 0;
  for (const Hop& h : route.hops) ns += hopLatency(h, c);
  return ns;
}

double writeTlpEfficiency(const PcieConstants& c, int payload) {
  if (payload <= 0) return 0;
  return payload / (payload + static_cast<double>(c.write_tlp_overhead_bytes) + c.ack_bytes_per_tlp);
}

double readDataEfficiency(const PcieConstants& c, uint64_t bytes, int completionBytes) {
  if (bytes == 0 || completionBytes <= 0) return 0;
  uint64_t completions = ceilDiv(bytes, static_cast<uint64_t>(completionBytes));
  double overhead = static_cast<double>(c.completion_overhead_bytes) + c.ack_bytes_per_tlp;
  return static_cast<double>(bytes) / (static_cast<double>(bytes) + completions * overhead);
}

double bytesInFlightFor(double gbs, double roundTripNs) {
  return gbs * roundTripNs;
}

TransferEstimate estimateWrite(const Route& route, uint64_t bytes, const PcieConstants& c) {
  TransferEstimate e;
  e.kind = Transaction::PostedWrite;
  e.bytes = bytes;
  e.params = resolveEndpoint(route, c);
  e.overheadPerDataTlp = static_cast<double>(c.write_tlp_overhead_bytes) + c.ack_bytes_per_tlp;
  e.latencyNs = traversalNs(route, c);
  RouteRates rates = routeRates(route, c);
  if (bytes == 0) {
    e.totalNs = e.latencyNs;
    return e;
  }
  // One TLP per MPS of payload (transfers are taken to start MPS-aligned, so none is split at
  // a 4 KiB boundary early).
  e.dataTlps = ceilDiv(bytes, static_cast<uint64_t>(e.params.mpsBytes));
  e.wireBytes = static_cast<double>(bytes) + e.dataTlps * e.overheadPerDataTlp;
  e.efficiency = static_cast<double>(bytes) / e.wireBytes;
  applyLinkLimit(e, rates);
  if (isPeerToPeer(route) && !std::isinf(rates.pcie)) {
    e.peerLimitGBs = rates.pcie * e.efficiency * c.rc_peer_write_fraction;
    lowerTo(e, e.peerLimitGBs, "root-complex P2P write forwarding");
  }
  // Posted: the data is at the completer one traversal after it left, no answer needed.
  e.totalNs = e.latencyNs + static_cast<double>(bytes) / e.bandwidthGBs;
  return e;
}

TransferEstimate estimateRead(const Route& route, uint64_t bytes, const PcieConstants& c) {
  TransferEstimate e;
  e.kind = Transaction::Read;
  e.bytes = bytes;
  e.params = resolveEndpoint(route, c);
  e.overheadPerDataTlp = static_cast<double>(c.completion_overhead_bytes) + c.ack_bytes_per_tlp;
  double oneWay = traversalNs(route, c);
  // Little's law below uses the bare round trip (as gdr-write-facts.md does): serialization is
  // a few ns at these rates and is already charged through the link limit.
  e.roundTripNs = 2 * oneWay + e.params.completerAccessNs;
  e.latencyNs = e.roundTripNs;
  RouteRates rates = routeRates(route, c);
  if (bytes == 0) {
    e.totalNs = e.latencyNs;
    return e;
  }
  const auto mrrs = static_cast<uint64_t>(e.params.mrrsBytes);
  const auto cpl = static_cast<uint64_t>(e.params.completionBytes);
  e.requestTlps = ceilDiv(bytes, mrrs);
  // Every request is answered separately, so a request's tail completion is short and the
  // count is per request, not per transfer.
  uint64_t fullRequests = bytes / mrrs;
  uint64_t tail = bytes % mrrs;
  e.dataTlps = fullRequests * ceilDiv(mrrs, cpl) + (tail ? ceilDiv(tail, cpl) : 0);
  e.wireBytes = static_cast<double>(bytes) + e.dataTlps * e.overheadPerDataTlp;
  e.reverseWireBytes =
      e.requestTlps * (static_cast<double>(c.read_request_overhead_bytes) + c.ack_bytes_per_tlp);
  e.efficiency = static_cast<double>(bytes) / e.wireBytes;
  applyLinkLimit(e, rates);
  if (e.roundTripNs > 0) {
    e.outstandingLimitGBs = static_cast<double>(e.params.maxOutstandingReads) * mrrs / e.roundTripNs;
    lowerTo(e, e.outstandingLimitGBs, "outstanding reads (tags x MRRS / round trip)");
  }
  if (isPeerToPeer(route)) {
    double peer = std::isinf(rates.pcie) ? kUnlimited : rates.pcie * e.efficiency * c.rc_peer_read_fraction;
    const char* why = "root-complex P2P read forwarding";
    if (rates.crossesSocket && c.socket_peer_read_gbs < peer) {
      peer = c.socket_peer_read_gbs;
      why = "P2P reads across the socket link";
    }
    if (!std::isinf(peer)) {
      e.peerLimitGBs = peer;
      lowerTo(e, peer, why);
    }
  }
  e.totalNs = e.latencyNs + static_cast<double>(bytes) / e.bandwidthGBs;
  return e;
}

std::string describeRoute(const Route& route) {
  std::string s;
  for (const Hop& h : route.hops) {
    if (!s.empty()) s += " > ";
    if (h.kind == HopKind::PcieLink) {
      s += h.pcieGen > 0 ? format("Gen%d", h.pcieGen) : std::string("Gen?");
      s += h.pcieWidth > 0 ? format(" x%d", h.pcieWidth) : std::string(" x?");
    } else if (h.kind == HopKind::PcieSwitch) {
      s += "switch";
    } else {
      s += hopKindName(h.kind);
    }
  }
  if (!s.empty()) s += " > ";
  return s + completerName(route.completer);
}

}  // namespace ridge::topo
