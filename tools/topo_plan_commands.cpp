// `ridge-topo plan` and `ridge-topo simulate`: the planner on a node topology that
// ridge-topo loaded (this machine, a file or a preset), for any node count and network.
//
//   ridge-topo plan --preset dgx-h100 -n 32 --network rails=8,nic=400G [--full] [--json|--dot]
//   ridge-topo simulate --preset dgx-h100 --nodes 512 --network ... [-b 8 -e 4G -f 4]
//                       [--collective allreduce,allgather] [--algo RULES] [--links N] [--compare]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/settings.h"
#include "plan/cost.h"
#include "plan/plan_io.h"
#include "tools/topo_commands.h"

namespace ridge::tools {
namespace {

constexpr int kOk = 0, kFailed = 1, kUsage = 2;

struct PlanArgs {
  int ranks = 0, nodes = 0, ranksPerNode = 0, maxChannels = 16;
  std::string network = plan::kDefaultNetworkSpec;
  bool full = false, json = false, dot = false, compare = false;
  std::string dotFile;
  // simulate
  std::vector<plan::Coll> colls;
  size_t minBytes = 8, maxBytes = size_t{4} << 30, factor = 4;
  std::string algo;
  int links = 8;
};

int usage(const char* cmd, const std::string& what) {
  std::fprintf(stderr, "ridge-topo %s: %s (see ridge-topo help %s)\n", cmd, what.c_str(), cmd);
  return kUsage;
}

bool parseCount(const std::string& s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end || v < 1 || v > (1 << 24)) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parseBytes(const std::string& s, size_t* out) {
  int64_t v = 0;
  if (!parseSize(s, &v) || v < 1) return false;
  *out = static_cast<size_t>(v);
  return true;
}

// Returns kOk, or the exit code of a usage error.
int parseArgs(const char* cmd, const CommonOptions& common, const std::vector<std::string>& args,
              bool simulate, PlanArgs* a) {
  a->json = common.format == OutputFormat::Json;
  a->dot = common.format == OutputFormat::Dot;
  a->dotFile = common.outputPath;
  a->algo = settingString(Setting::ALGO);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& o = args[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= args.size()) return false;
      *v = args[++i];
      return true;
    };
    std::string v;
    if (o == "-n" || o == "--ranks") {
      if (!value(&v) || !parseCount(v, &a->ranks)) return usage(cmd, "-n needs a rank count");
    } else if (o == "--nodes") {
      if (!value(&v) || !parseCount(v, &a->nodes)) return usage(cmd, "--nodes needs a node count");
    } else if (o == "--ranks-per-node") {
      if (!value(&v) || !parseCount(v, &a->ranksPerNode)) return usage(cmd, "--ranks-per-node needs a count");
    } else if (o == "--max-channels") {
      if (!value(&v) || !parseCount(v, &a->maxChannels) || a->maxChannels > 64)
        return usage(cmd, "--max-channels needs 1 to 64");
    } else if (o == "--network") {
      if (!value(&a->network)) return usage(cmd, "--network needs a spec");
    } else if (o == "--full") {
      a->full = true;
    } else if (o == "--json") {
      a->json = true;
    } else if (o == "--dot") {
      a->dot = true;
      if (i + 1 < args.size() && args[i + 1][0] != '-') a->dotFile = args[++i];
    } else if (simulate && o == "--collective") {
      if (!value(&v)) return usage(cmd, "--collective needs a list");
      std::stringstream ss(v);
      std::string c;
      while (std::getline(ss, c, ',')) {
        plan::Coll coll;
        if (!plan::parseCollName(c, &coll)) return usage(cmd, "unknown collective '" + c + "'");
        a->colls.push_back(coll);
      }
    } else if (simulate && (o == "-b" || o == "--minbytes")) {
      if (!value(&v) || !parseBytes(v, &a->minBytes)) return usage(cmd, "-b needs a size");
    } else if (simulate && (o == "-e" || o == "--maxbytes")) {
      if (!value(&v) || !parseBytes(v, &a->maxBytes)) return usage(cmd, "-e needs a size");
    } else if (simulate && (o == "-f" || o == "--stepfactor")) {
      if (!value(&v) || !parseBytes(v, &a->factor) || a->factor < 2)
        return usage(cmd, "-f needs a factor >= 2");
    } else if (simulate && o == "--algo") {
      if (!value(&a->algo)) return usage(cmd, "--algo needs rules (RIDGE_ALGO syntax)");
    } else if (simulate && o == "--links") {
      if (!value(&v) || (v != "0" && !parseCount(v, &a->links))) return usage(cmd, "--links needs a count");
      if (v == "0") a->links = 0;
    } else if (simulate && o == "--compare") {
      a->compare = true;
    } else {
      return usage(cmd, "unknown option '" + o + "'");
    }
  }
  if (a->colls.empty())
    for (int c = 0; c < plan::kCollCount; ++c) a->colls.push_back(static_cast<plan::Coll>(c));
  if (a->minBytes > a->maxBytes) return usage(cmd, "-b is larger than -e");
  return kOk;
}

// Builds the plan; prints the error and returns false on failure.
bool build(const topo::Topology& node, const PlanArgs& a, std::shared_ptr<const plan::Plan>* out, int* rc) {
  plan::PlanRequest req;
  const int gpus = static_cast<int>(node.gpus().size());
  req.nodes = a.nodes;
  req.ranksPerNode = a.ranksPerNode;
  req.nranks = a.ranks;
  if (req.nranks == 0) {
    const int perNode = a.ranksPerNode > 0 ? a.ranksPerNode : std::max(gpus, 1);
    req.nranks = std::max(a.nodes, 1) * perNode;
    if (req.nodes == 0) req.nodes = 1;
  }
  req.search.maxChannels = a.maxChannels;
  Status s = plan::parseNetworkSpec(a.network, &req.network, &req.tcp);
  if (s.isOk()) s = plan::gdrModeFromSettings(&req.search.forcedGdrMode);
  if (!s.isOk()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    *rc = kUsage;
    return false;
  }
  // The node topology is owned by ridge-topo; the plan keeps a non-owning view of it.
  std::shared_ptr<const topo::Topology> view(&node, [](const topo::Topology*) {});
  auto p = std::make_shared<plan::Plan>();
  s = plan::buildPlan(view, req, p.get());
  if (!s.isOk()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    *rc = kFailed;
    return false;
  }
  *out = p;
  return true;
}

int emit(const std::string& text, const std::string& path) {
  if (path.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return kOk;
  }
  Status s = plan::writeTextFile(path, text);
  if (!s.isOk()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return kFailed;
  }
  return kOk;
}

std::string sizeText(size_t b) {
  const char* units[] = {"B", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && b >= 1024 && b % 1024 == 0) b /= 1024, ++u;
  return std::to_string(b) + units[u];
}

}  // namespace

int runPlanCommand(const topo::Topology& node, const CommonOptions& common,
                   const std::vector<std::string>& args) {
  PlanArgs a;
  if (int rc = parseArgs("plan", common, args, false, &a); rc != kOk) return rc;
  std::shared_ptr<const plan::Plan> p;
  int rc = kOk;
  if (!build(node, a, &p, &rc)) return rc;
  plan::PrintOptions po;
  po.full = a.full;
  if (a.dot) return emit(plan::planDot(*p, a.full ? p->nodes : 4), a.dotFile);
  // The one writer a communicator's RIDGE_PLAN_DUMP goes through too: same input, same bytes.
  if (a.json) return emit(plan::planJsonText(*p, po), common.outputPath);
  return emit(plan::planText(*p, po), common.outputPath);
}

int runSimulateCommand(const topo::Topology& node, const CommonOptions& common,
                       const std::vector<std::string>& args) {
  PlanArgs a;
  if (int rc = parseArgs("simulate", common, args, true, &a); rc != kOk) return rc;
  std::vector<plan::AlgoRule> rules;
  std::string bad;
  if (!plan::parseAlgoRules(a.algo, &rules, &bad))
    return usage("simulate", "malformed --algo entries: " + bad);
  std::shared_ptr<const plan::Plan> p;
  int rc = kOk;
  if (!build(node, a, &p, &rc)) return rc;
  plan::CostModel model(p);
  std::vector<plan::Estimate> results, compared;
  for (plan::Coll c : a.colls)
    for (size_t b = a.minBytes; b <= a.maxBytes; b = b > SIZE_MAX / a.factor ? SIZE_MAX : b * a.factor) {
      results.push_back(model.best(c, b, &rules));
      if (a.compare)
        for (int al = 0; al < plan::kAlgorithmCount; ++al) {
          plan::Estimate e = model.estimate(c, b, static_cast<plan::Algorithm>(al));
          if (e.valid) compared.push_back(e);
        }
      if (b == SIZE_MAX) break;
    }
  // Per-resource load of the largest allreduce (or of the first collective asked for).
  const plan::Coll loadColl = a.colls.front();
  const plan::Estimate loadAt = model.best(loadColl, a.maxBytes, &rules);
  const std::vector<plan::ResourceLoad> loads = model.loads(loadAt, static_cast<size_t>(a.links));
  if (a.json) {
    json::Value doc = json::Value::object();
    plan::PrintOptions po;
    po.full = a.full;
    po.maxListedRanks = 0;
    json::Value summary = json::Value::object();
    summary.set("nranks", p->nranks);
    summary.set("nodes", p->nodes);
    summary.set("ranksPerNode", p->ranksPerNode);
    summary.set("network", plan::formatNetworkSpec(p->network, p->tcp));
    summary.set("channels", static_cast<int>(p->rings.size()));
    summary.set("buildMs", p->buildMs);
    doc.set("plan", std::move(summary));
    auto rows = [](const std::vector<plan::Estimate>& v) {
      json::Value arr = json::Value::array();
      for (const plan::Estimate& e : v) {
        json::Value r = json::Value::object();
        r.set("collective", plan::collName(e.coll));
        r.set("bytes", static_cast<uint64_t>(e.bytes));
        r.set("algo", plan::algorithmName(e.algo));
        r.set("protocol", plan::protocolName(e.proto));
        r.set("channels", e.channels);
        r.set("timeUs", e.timeUs);
        r.set("algbwGBs", e.algbwGBs);
        r.set("busbwGBs", e.busbwGBs);
        r.set("bottleneck", e.bottleneck);
        arr.push(std::move(r));
      }
      return arr;
    };
    doc.set("results", rows(results));
    if (a.compare) doc.set("compare", rows(compared));
    json::Value l = json::Value::array();
    for (const plan::ResourceLoad& r : loads) {
      json::Value x = json::Value::object();
      x.set("resource", r.name);
      x.set("capacityGBs", std::isfinite(r.capacityGBs) ? json::Value(r.capacityGBs) : json::Value());
      x.set("bytes", r.bytes);
      x.set("busyUs", r.busyUs);
      l.push(std::move(x));
    }
    json::Value lo = json::Value::object();
    lo.set("collective", plan::collName(loadColl));
    lo.set("bytes", static_cast<uint64_t>(a.maxBytes));
    lo.set("algo", plan::algorithmName(loadAt.algo));
    lo.set("resources", std::move(l));
    doc.set("loads", std::move(lo));
    return emit(json::write(doc) + "\n", common.outputPath);
  }
  std::ostringstream o;
  char line[512];
  double total = 0;
  for (const plan::ChannelTemplate& ct : p->node->channels) total += ct.speedGBs;
  o << "# " << p->nranks << " ranks = " << p->nodes << " x " << p->ranksPerNode << " of '" << node.name
    << "'";
  if (p->nodes > 1) o << ", network " << plan::formatNetworkSpec(p->network, p->tcp);
  o << "; " << p->rings.size() << " ring channels (" << total << " GB/s per rank), plan built in "
    << p->buildMs << " ms\n";
  o << "# busbw as nccl-tests: allreduce x 2(n-1)/n, allgather/reducescatter/alltoall x (n-1)/n\n";
  std::snprintf(line, sizeof line, "%-14s %8s %-8s %-6s %3s %13s %12s %12s  %s\n", "# collective", "size",
                "algo", "proto", "ch", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "bottleneck");
  o << line;
  auto row = [&](const plan::Estimate& e) {
    std::snprintf(line, sizeof line, "%-14s %8s %-8s %-6s %3d %13.2f %12.2f %12.2f  %s\n",
                  plan::collName(e.coll), sizeText(e.bytes).c_str(), plan::algorithmName(e.algo),
                  plan::protocolName(e.proto), e.channels, e.timeUs, e.algbwGBs, e.busbwGBs,
                  e.bottleneck.c_str());
    o << line;
  };
  for (const plan::Estimate& e : results) row(e);
  if (a.compare) {
    o << "# every algorithm the model prices:\n";
    for (const plan::Estimate& e : compared) row(e);
  }
  if (!loads.empty()) {
    o << "# busiest resources for " << plan::collName(loadColl) << " of " << sizeText(a.maxBytes) << " ("
      << plan::algorithmName(loadAt.algo) << ", " << loadAt.channels
      << " channels); worst node, per direction:\n";
    for (const plan::ResourceLoad& r : loads) {
      std::snprintf(line, sizeof line, "  %-52s %9.2f GB/s %12.3f GB %12.2f us busy\n", r.name.c_str(),
                    r.capacityGBs, r.bytes / 1e9, r.busyUs);
      o << line;
    }
  }
  return emit(o.str(), common.outputPath);
}

}  // namespace ridge::tools
