#include "topo/gdr_advisor.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "core/json.h"
#include "core/settings.h"

namespace ridge::topo {

namespace {

constexpr double kUnlimited = std::numeric_limits<double>::infinity();

// How a stage's time is computed.
enum class StageKind : uint8_t {
  Fixed,         // a fixed cost (software, NIC processing)
  Doorbell,      // a doorbell-sized posted write along a route, once per message or chunk
  Write,         // posted writes of the payload along a route
  Read,          // the payload read along a route
  NicLocalRead,  // the NIC reads staged data from its own memory
};

struct StageSpec {
  std::string name;
  StageKind kind = StageKind::Fixed;
  Route route;
  double fixedNs = 0;
};

double stageTimeNs(const StageSpec& s, uint64_t bytes, const PcieConstants& c) {
  switch (s.kind) {
    case StageKind::Fixed: return s.fixedNs;
    case StageKind::Doorbell:
      return estimateWrite(s.route, static_cast<uint64_t>(c.doorbell_bytes), c).totalNs;
    case StageKind::Write: return estimateWrite(s.route, bytes, c).totalNs;
    case StageKind::Read: return estimateRead(s.route, bytes, c).totalNs;
    case StageKind::NicLocalRead:
      return c.nic_memory_access_ns + static_cast<double>(bytes) / c.nic_memory_read_gbs;
  }
  return 0;
}

bool isDataStage(const StageSpec& s) {
  return s.kind == StageKind::Write || s.kind == StageKind::Read || s.kind == StageKind::NicLocalRead;
}

// Steady rate of a data stage for a large transfer, and what limits it.
double stageRateGBs(const StageSpec& s, uint64_t bytes, const PcieConstants& c, std::string* why) {
  TransferEstimate e;
  switch (s.kind) {
    case StageKind::Write: e = estimateWrite(s.route, bytes, c); break;
    case StageKind::Read: e = estimateRead(s.route, bytes, c); break;
    case StageKind::NicLocalRead: *why = "NIC memory read rate"; return c.nic_memory_read_gbs;
    default: return kUnlimited;
  }
  *why = e.limitedBy;
  return e.bandwidthGBs;
}

std::vector<StageSpec> stagesOf(GdrOption o, StagingTier tier, const GdrPlacement& p,
                                const PcieConstants& c) {
  std::vector<StageSpec> s;
  const Route& toNic = p.gpuToNic;
  switch (o) {
    case GdrOption::GdrRead:
      // The trigger is taken to be a GPU-rung doorbell (as GPU-initiated verbs do) so that the
      // comparison with gdr-write is about how the payload moves, not who posts.
      s.push_back({"GPU rings the NIC doorbell", StageKind::Doorbell, toNic, 0});
      s.push_back({"NIC starts the DMA", StageKind::Fixed, {}, c.nic_doorbell_processing_ns});
      s.push_back({"NIC reads GPU memory", StageKind::Read, reverseRoute(toNic, Completer::GpuMemory), 0});
      break;
    case GdrOption::GdrWrite:
      if (tier == StagingTier::NicMemory) {
        Route toNicMemory = toNic;
        toNicMemory.completer = Completer::NicMemory;
        s.push_back({"GPU writes NIC memory", StageKind::Write, toNicMemory, 0});
      } else {
        s.push_back({"GPU writes host memory by the NIC", StageKind::Write, p.gpuToHostMemory, 0});
      }
      s.push_back({"GPU rings the NIC doorbell", StageKind::Doorbell, toNic, 0});
      s.push_back({"NIC starts the DMA", StageKind::Fixed, {}, c.nic_doorbell_processing_ns});
      if (tier == StagingTier::NicMemory) {
        s.push_back({"NIC reads its own memory", StageKind::NicLocalRead, {}, 0});
      } else {
        s.push_back({"NIC reads host memory", StageKind::Read, p.nicToHostMemory, 0});
      }
      break;
    case GdrOption::HostStaged:
      s.push_back({"copy engine starts", StageKind::Fixed, {}, c.copy_engine_start_ns});
      s.push_back({"copy engine writes host memory", StageKind::Write, p.gpuToHostMemory, 0});
      s.push_back({"CPU proxy posts the send", StageKind::Fixed, {}, c.proxy_post_ns});
      s.push_back({"NIC starts the DMA", StageKind::Fixed, {}, c.nic_doorbell_processing_ns});
      s.push_back({"NIC reads host memory", StageKind::Read, p.nicToHostMemory, 0});
      break;
  }
  return s;
}

double latencyOf(const GdrOptionEstimate& e) {
  return e.latencyNs.empty() ? 0 : e.latencyNs.front();
}

// True when `a` beats `b` by the advisor's rule: more large-message bandwidth beyond the tie
// fraction, else (level bandwidth) less small-message latency beyond its tie fraction.
bool beats(const GdrOptionEstimate& a, const GdrOptionEstimate& b, const PcieConstants& c) {
  double bwA = a.largeBandwidthGBs, bwB = b.largeBandwidthGBs;
  if (bwA > bwB && bwB < bwA * (1 - c.advisor_bandwidth_tie_fraction)) return true;
  if (bwB > bwA && bwA < bwB * (1 - c.advisor_bandwidth_tie_fraction)) return false;
  return latencyOf(a) * (1 + c.advisor_latency_tie_fraction) < latencyOf(b);
}

GdrOptionEstimate estimateTier(GdrOption o, StagingTier tier, const GdrPlacement& p, const PcieConstants& c) {
  GdrOptionEstimate e;
  e.option = o;
  e.staging = tier;
  switch (o) {
    case GdrOption::GdrRead:
      e.possible = p.nicReadsGpuMemory;
      if (!e.possible) e.whyNot = "the NIC cannot read GPU memory (no dma-buf or peer-memory registration)";
      break;
    case GdrOption::GdrWrite:
      e.possible = p.gpuRingsNicDoorbell;
      if (!e.possible) e.whyNot = "the GPU cannot ring the NIC doorbell (doorbell page not mapped)";
      break;
    case GdrOption::HostStaged:
      e.possible = p.hostStaging;
      if (!e.possible) e.whyNot = "no pinned host staging memory";
      break;
  }
  if (!p.nicRdma) {
    e.possible = false;
    e.whyNot = p.nic + " has no RDMA (verbs) device: not a GPUDirect target";
  }
  std::vector<StageSpec> specs = stagesOf(o, e.staging, p, c);

  uint64_t chunk = static_cast<uint64_t>(c.pipeline_chunk_bytes);
  // NIC memory holds at least two chunks so that the GPU can fill one while the NIC sends the
  // other.
  if (e.staging == StagingTier::NicMemory)
    chunk = std::min(chunk, static_cast<uint64_t>(c.nic_staging_bytes) / 2);
  chunk = std::max<uint64_t>(chunk, 1);

  e.steadyBandwidthGBs = kUnlimited;
  e.limitedBy = "nothing (no rated link)";
  double chunkCycleNs = 0;
  uint64_t firstSmall = p.smallSizes.empty() ? 8 : p.smallSizes.front();
  for (const StageSpec& s : specs) {
    GdrStage st;
    st.name = s.name;
    st.smallNs = stageTimeNs(s, firstSmall, c);
    chunkCycleNs += stageTimeNs(s, chunk, c);
    if (isDataStage(s)) {
      st.bandwidthGBs = stageRateGBs(s, p.largeSize, c, &st.limitedBy);
      if (st.bandwidthGBs < e.steadyBandwidthGBs) {
        e.steadyBandwidthGBs = st.bandwidthGBs;
        e.limitedBy = s.name + ": " + st.limitedBy;
      }
    }
    e.stages.push_back(std::move(st));
  }
  // The GPU may only write what the NIC has room for: a staging slot is busy from the GPU's
  // first write until the send has completed, so NIC memory bounds the rate (Little's law).
  if (e.staging == StagingTier::NicMemory) {
    double credit = static_cast<double>(c.nic_staging_bytes) / (chunkCycleNs + c.staging_credit_return_ns);
    if (credit < e.steadyBandwidthGBs) {
      e.steadyBandwidthGBs = credit;
      e.limitedBy = format("NIC staging credits (%s in flight per %.1f us cycle)",
                           sizeLabel(static_cast<uint64_t>(c.nic_staging_bytes)).c_str(),
                           (chunkCycleNs + c.staging_credit_return_ns) / 1000);
    }
  }
  if (p.nicPortGBs > 0 && p.nicPortGBs < e.steadyBandwidthGBs) {
    e.steadyBandwidthGBs = p.nicPortGBs;
    e.limitedBy = "NIC port rate";
  }

  // Small messages go through the stages one after the other; a large one is pipelined in
  // chunks: the first chunk pays every stage, the rest flow at the steady rate.
  auto timeNs = [&](uint64_t bytes) {
    uint64_t first = std::min(bytes, chunk);
    double t = 0;
    for (const StageSpec& s : specs) t += stageTimeNs(s, first, c);
    if (bytes > first) t += static_cast<double>(bytes - first) / e.steadyBandwidthGBs;
    return t;
  };
  for (uint64_t size : p.smallSizes) e.latencyNs.push_back(timeNs(size));
  double largeNs = timeNs(p.largeSize);
  e.largeBandwidthGBs = largeNs > 0 ? static_cast<double>(p.largeSize) / largeNs : kUnlimited;
  return e;
}

GdrOptionEstimate estimateOption(GdrOption o, const GdrPlacement& p, const PcieConstants& c) {
  switch (o) {
    case GdrOption::GdrRead: return estimateTier(o, StagingTier::None, p, c);
    case GdrOption::HostStaged: return estimateTier(o, StagingTier::HostMemory, p, c);
    case GdrOption::GdrWrite: break;
  }
  GdrOptionEstimate host = estimateTier(o, StagingTier::HostMemory, p, c);
  if (!p.nicStagingMemory) return host;
  // NIC memory saves the NIC's read across its link but is small, so its credits can cap the
  // rate below what host memory allows: the model picks the tier, by the same rule as options.
  GdrOptionEstimate nic = estimateTier(o, StagingTier::NicMemory, p, c);
  GdrOptionEstimate& won = beats(host, nic, c) ? host : nic;
  const GdrOptionEstimate& lost = &won == &host ? nic : host;
  won.otherTier = format("%s staging: %.1f GB/s (%s), %.2f us at %s", stagingTierName(lost.staging),
                         lost.largeBandwidthGBs, lost.limitedBy.c_str(), latencyOf(lost) / 1000,
                         sizeLabel(p.smallSizes.empty() ? 8 : p.smallSizes.front()).c_str());
  return won;
}

// Order in which the placement's class prefers the options when the model calls them level:
// under a shared switch reading GPU memory costs no copy; past the root complex the long path
// is better crossed once with writes, and host staging is the safe fallback.
std::vector<GdrOption> classPreference(PlacementClass c) {
  if (c == PlacementClass::PIX || c == PlacementClass::PXB) {
    return {GdrOption::GdrRead, GdrOption::GdrWrite, GdrOption::HostStaged};
  }
  return {GdrOption::GdrWrite, GdrOption::HostStaged, GdrOption::GdrRead};
}

bool pastRootComplex(PlacementClass c) {
  return c == PlacementClass::PHB || c == PlacementClass::NODE || c == PlacementClass::SYS;
}

std::string wherePhrase(const GdrAdvice& a) {
  const char* g = a.gpu.c_str();
  const char* n = a.nic.c_str();
  switch (a.pathClass) {
    case PlacementClass::PIX: return format("%s and %s share a PCIe switch (PIX)", g, n);
    case PlacementClass::PXB: return format("%s and %s share a PCIe switch hierarchy (PXB)", g, n);
    case PlacementClass::PHB: return format("%s reaches %s through the root complex (PHB)", g, n);
    case PlacementClass::NODE:
      return format("%s reaches %s through several host bridges of one CPU (NODE)", g, n);
    case PlacementClass::SYS: return format("%s reaches %s across the socket link (SYS)", g, n);
    case PlacementClass::Unknown: break;
  }
  return format("%s to %s", g, n);
}

std::string winnerPhrase(const GdrOptionEstimate& e) {
  double bw = e.largeBandwidthGBs;
  switch (e.option) {
    case GdrOption::GdrRead: return format("NIC reads GPU memory at %.1f GB/s, no staging copy", bw);
    case GdrOption::GdrWrite:
      if (e.staging == StagingTier::NicMemory)
        return format("GPU posted writes into NIC memory reach %.1f GB/s", bw);
      return format("GPU posted writes into host memory by the NIC, which the NIC then reads: %.1f GB/s", bw);
    case GdrOption::HostStaged: return format("host-staged copy and CPU-posted send reach %.1f GB/s", bw);
  }
  return "";
}

// The stage-level limit without the stage name ("root-complex P2P read forwarding").
std::string bareLimit(const GdrOptionEstimate& e) {
  size_t colon = e.limitedBy.find(": ");
  return colon == std::string::npos ? e.limitedBy : e.limitedBy.substr(colon + 2);
}

std::string loserPhrase(const GdrOptionEstimate& e, PlacementClass c) {
  double bw = e.largeBandwidthGBs;
  if (e.option == GdrOption::GdrRead && pastRootComplex(c)) {
    const char* crossing = c == PlacementClass::SYS ? "the socket link" : "the root complex";
    return format(
        "NIC reads of GPU memory cross %s twice (request out, completions back) and are held to %.1f GB/s "
        "by %s",
        crossing, bw, bareLimit(e).c_str());
  }
  return format("%s reaches %.1f GB/s (limited by %s)", gdrOptionName(e.option), bw, e.limitedBy.c_str());
}

void decide(GdrAdvice& a, const PcieConstants& c) {
  std::vector<GdrOption> possible;
  for (int i = 0; i < kGdrOptionCount; ++i) {
    if (a.options[i].possible) possible.push_back(static_cast<GdrOption>(i));
  }
  std::string where = wherePhrase(a);
  std::string small = a.smallSizes.empty() ? "small" : sizeLabel(a.smallSizes.front());
  if (possible.empty()) {
    a.chosen = GdrOption::HostStaged;
    a.decidedBy = "nothing possible";
    std::string why;
    for (const GdrOptionEstimate& e : a.options) why += (why.empty() ? "" : "; ") + e.whyNot;
    a.reason =
        format("%s: no option is possible (%s); host-staged is the fallback", where.c_str(), why.c_str());
    return;
  }

  // Bandwidth first: large messages dominate the time of the collectives Ridge runs. Options
  // within the tie fraction count as equal because the model is not more accurate than that.
  double bestBw = 0;
  for (GdrOption o : possible) bestBw = std::max(bestBw, a.estimate(o).largeBandwidthGBs);
  std::vector<GdrOption> level;
  for (GdrOption o : possible) {
    if (a.estimate(o).largeBandwidthGBs >= bestBw * (1 - c.advisor_bandwidth_tie_fraction))
      level.push_back(o);
  }
  double bestLat = kUnlimited;
  for (GdrOption o : level) bestLat = std::min(bestLat, latencyOf(a.estimate(o)));
  std::vector<GdrOption> fastest;
  for (GdrOption o : level) {
    if (latencyOf(a.estimate(o)) <= bestLat * (1 + c.advisor_latency_tie_fraction)) fastest.push_back(o);
  }
  std::vector<GdrOption> order = classPreference(a.pathClass);
  for (GdrOption o : order) {
    if (std::find(fastest.begin(), fastest.end(), o) != fastest.end()) {
      a.chosen = o;
      break;
    }
  }
  if (possible.size() == 1) {
    a.decidedBy = "only option";
  } else if (level.size() == 1) {
    a.decidedBy = "bandwidth";
  } else if (fastest.size() == 1) {
    a.decidedBy = "latency";
  } else {
    a.decidedBy = "class rule";
  }

  // The strongest other option (by bandwidth) is the one the reason argues against.
  const GdrOptionEstimate& won = a.estimate(a.chosen);
  const GdrOptionEstimate* other = nullptr;
  for (GdrOption o : possible) {
    if (o == a.chosen) continue;
    const GdrOptionEstimate& e = a.estimate(o);
    if (!other || e.largeBandwidthGBs > other->largeBandwidthGBs) other = &e;
  }

  std::string reason = where + ": " + winnerPhrase(won);
  if (a.decidedBy == "only option") {
    std::string why;
    for (const GdrOptionEstimate& e : a.options) {
      if (!e.possible)
        why += format("%s%s: %s", why.empty() ? "" : "; ", gdrOptionName(e.option), e.whyNot.c_str());
    }
    reason += format("; the only possible option (%s)", why.c_str());
  } else if (a.decidedBy == "bandwidth") {
    reason += "; " + loserPhrase(*other, a.pathClass);
  } else if (a.decidedBy == "latency") {
    const GdrOptionEstimate* rival = nullptr;
    for (GdrOption o : level) {
      if (o != a.chosen && (!rival || latencyOf(a.estimate(o)) < latencyOf(*rival))) rival = &a.estimate(o);
    }
    reason += format("; %s moves as much (%.1f GB/s) but takes %.2f us at %s against %.2f us",
                     gdrOptionName(rival->option), rival->largeBandwidthGBs, latencyOf(*rival) / 1000,
                     small.c_str(), latencyOf(won) / 1000);
    other = rival;
  } else {
    const GdrOptionEstimate* rival = nullptr;
    for (GdrOption o : fastest) {
      if (o != a.chosen) {
        rival = &a.estimate(o);
        break;
      }
    }
    reason += format(
        "; the model puts %s level (%.1f GB/s, %.2f us at %s against %.2f us), so the %s rule prefers %s",
        gdrOptionName(rival->option), rival->largeBandwidthGBs, latencyOf(*rival) / 1000, small.c_str(),
        latencyOf(won) / 1000, placementClassName(a.pathClass), gdrOptionName(a.chosen));
    other = rival;
  }
  // Past the root complex gdr-write is the design's answer; when the model does not pick it,
  // say what held it back instead of leaving the reader to guess.
  const GdrOptionEstimate& gw = a.estimate(GdrOption::GdrWrite);
  if (pastRootComplex(a.pathClass) && a.chosen != GdrOption::GdrWrite && gw.possible && other != &gw) {
    reason += format("; gdr-write reaches only %.1f GB/s (limited by %s), %.2f us at %s",
                     gw.largeBandwidthGBs, gw.limitedBy.c_str(), latencyOf(gw) / 1000, small.c_str());
  }
  // ... and why the classic path lost, which is what a reader of NCCL's rules expects to see.
  const GdrOptionEstimate& gr = a.estimate(GdrOption::GdrRead);
  if (pastRootComplex(a.pathClass) && a.chosen != GdrOption::GdrRead && gr.possible && other != &gr) {
    reason += "; " + loserPhrase(gr, a.pathClass);
  }
  a.reason = reason;
}

std::string jsonNumber(double v) {
  return std::isfinite(v) ? format("%.6g", v) : std::string("null");
}

std::string rateText(double gbs) {
  return std::isfinite(gbs) ? format("%.1f", gbs) : std::string("-");
}

}  // namespace

const char* gdrOptionName(GdrOption o) {
  switch (o) {
    case GdrOption::GdrRead: return "gdr-read";
    case GdrOption::GdrWrite: return "gdr-write";
    case GdrOption::HostStaged: return "host-staged";
  }
  return "?";
}

bool parseGdrModeSetting(const std::string& text, GdrModeSetting* out) {
  std::string t = text;
  for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  GdrModeSetting m;
  if (t.empty() || t == "off") {
    m.kind = GdrModeSetting::Kind::Off;
  } else if (t == "auto") {
    m.kind = GdrModeSetting::Kind::Auto;
  } else {
    // The transport's short names and the advisor's long ones.
    static const char* const kShort[kGdrOptionCount] = {"read", "write", "staged"};
    int found = -1;
    for (int o = 0; o < kGdrOptionCount; ++o)
      if (t == kShort[o] || t == gdrOptionName(static_cast<GdrOption>(o))) found = o;
    if (found < 0) return false;
    m.kind = GdrModeSetting::Kind::Forced;
    m.forced = static_cast<GdrOption>(found);
  }
  *out = m;
  return true;
}

Status readGdrModeSetting(GdrModeSetting* out) {
  const std::string text = settingString(Setting::GDR_MODE);
  if (!parseGdrModeSetting(text, out))
    return makeError(ridgeInvalidArgument, "RIDGE_GDR_MODE='%s': expected read, write, staged, auto or off",
                     text.c_str());
  return Status::ok();
}

const char* placementClassName(PlacementClass c) {
  switch (c) {
    case PlacementClass::Unknown: return "unknown";
    case PlacementClass::PIX: return "PIX";
    case PlacementClass::PXB: return "PXB";
    case PlacementClass::PHB: return "PHB";
    case PlacementClass::NODE: return "NODE";
    case PlacementClass::SYS: return "SYS";
  }
  return "?";
}

const char* stagingTierName(StagingTier t) {
  switch (t) {
    case StagingTier::None: return "none";
    case StagingTier::NicMemory: return "NIC memory";
    case StagingTier::HostMemory: return "host memory";
  }
  return "?";
}

PlacementClass classifyRoute(const Route& gpuToNic) {
  int switches = 0, rootComplexes = 0;
  for (const Hop& h : gpuToNic.hops) {
    if (h.kind == HopKind::SocketLink) return PlacementClass::SYS;
    if (h.kind == HopKind::RootComplex) ++rootComplexes;
    if (h.kind == HopKind::PcieSwitch) ++switches;
  }
  if (rootComplexes >= 2) return PlacementClass::NODE;
  if (rootComplexes == 1) return PlacementClass::PHB;
  return switches > 1 ? PlacementClass::PXB : PlacementClass::PIX;
}

std::string sizeLabel(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return format("%llu %s", static_cast<unsigned long long>(bytes), kUnits[u]);
}

GdrAdvice adviseGdr(const GdrPlacement& placement, const PcieConstants& constants) {
  GdrAdvice a;
  a.gpu = placement.gpu;
  a.nic = placement.nic;
  a.pathClass = placement.pathClass != PlacementClass::Unknown ? placement.pathClass
                                                               : classifyRoute(placement.gpuToNic);
  a.smallSizes = placement.smallSizes;
  a.largeSize = placement.largeSize;
  for (int i = 0; i < kGdrOptionCount; ++i) {
    a.options[i] = estimateOption(static_cast<GdrOption>(i), placement, constants);
  }
  decide(a, constants);
  return a;
}

std::vector<std::vector<std::string>> gdrAdviceRows(const GdrAdvice& a) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"option", "possible", "staging"};
  for (uint64_t s : a.smallSizes) header.push_back(sizeLabel(s) + " us");
  header.push_back(sizeLabel(a.largeSize) + " GB/s");
  header.push_back("limited by");
  header.push_back("");
  rows.push_back(header);
  for (const GdrOptionEstimate& e : a.options) {
    std::vector<std::string> r = {gdrOptionName(e.option), e.possible ? "yes" : "no",
                                  stagingTierName(e.staging)};
    for (double ns : e.latencyNs) r.push_back(format("%.2f", ns / 1000));
    r.push_back(rateText(e.largeBandwidthGBs));
    r.push_back(e.possible ? e.limitedBy : e.whyNot);
    r.push_back(e.option == a.chosen ? "<- chosen" : "");
    rows.push_back(r);
  }
  return rows;
}

std::string gdrAdviceText(const GdrAdvice& a) {
  std::vector<std::vector<std::string>> rows = gdrAdviceRows(a);
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()));
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      if (i) line += "  ";
      line += r[i];
      if (i + 1 < r.size()) line.append(width[i] - r[i].size(), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  for (const GdrOptionEstimate& e : a.options) {
    if (!e.otherTier.empty())
      out += format("%s, not taken: %s\n", gdrOptionName(e.option), e.otherTier.c_str());
  }
  out += format("%s -> %s (%s): %s: %s\n", a.gpu.c_str(), a.nic.c_str(), placementClassName(a.pathClass),
                gdrOptionName(a.chosen), a.reason.c_str());
  return out;
}

std::string gdrAdviceJson(const GdrAdvice& a) {
  std::string j = "{";
  j += "\"gpu\":" + json::quote(a.gpu) + ",\"nic\":" + json::quote(a.nic);
  j += ",\"class\":" + json::quote(placementClassName(a.pathClass));
  j += ",\"chosen\":" + json::quote(gdrOptionName(a.chosen));
  j += ",\"decided_by\":" + json::quote(a.decidedBy);
  j += ",\"reason\":" + json::quote(a.reason);
  j += ",\"large_bytes\":" + std::to_string(a.largeSize);
  j += ",\"options\":[";
  for (int i = 0; i < kGdrOptionCount; ++i) {
    const GdrOptionEstimate& e = a.options[i];
    if (i) j += ",";
    j += "{\"option\":" + json::quote(gdrOptionName(e.option));
    j += ",\"possible\":" + std::string(e.possible ? "true" : "false");
    j += ",\"why_not\":" + json::quote(e.whyNot);
    j += ",\"staging\":" + json::quote(stagingTierName(e.staging));
    j += ",\"latency_ns\":{";
    for (size_t k = 0; k < e.latencyNs.size() && k < a.smallSizes.size(); ++k) {
      j += (k ? ",\"" : "\"") + std::to_string(a.smallSizes[k]) + "\":" + jsonNumber(e.latencyNs[k]);
    }
    j += "},\"large_bandwidth_gbs\":" + jsonNumber(e.largeBandwidthGBs);
    j += ",\"steady_bandwidth_gbs\":" + jsonNumber(e.steadyBandwidthGBs);
    j += ",\"limited_by\":" + json::quote(e.limitedBy);
    j += ",\"other_tier\":" + json::quote(e.otherTier);
    j += ",\"stages\":[";
    for (size_t k = 0; k < e.stages.size(); ++k) {
      const GdrStage& s = e.stages[k];
      if (k) j += ",";
      j += "{\"stage\":" + json::quote(s.name) + ",\"small_ns\":" + jsonNumber(s.smallNs);
      j += ",\"bandwidth_gbs\":" + (s.bandwidthGBs > 0 ? jsonNumber(s.bandwidthGBs) : std::string("null"));
      j += ",\"limited_by\":" + json::quote(s.limitedBy) + "}";
    }
    j += "]}";
  }
  j += "]}";
  return j;
}

}  // namespace ridge::topo
