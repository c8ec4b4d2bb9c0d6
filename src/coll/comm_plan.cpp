// The host plan of a communicator: which ring the ring and chain algorithms follow, and
// which algorithm each collective and size runs (docs/planner.md, "Host collectives").
#include <numeric>

#include "coll/comm.h"
#include "core/json.h"
#include "core/log.h"
#include "core/settings.h"
#include "plan/host_plan.h"
#include "plan/plan_io.h"

namespace ridge {

namespace {

// What RIDGE_PLAN_DUMP holds: the ring, where every rank sits, the rules in force and the
// algorithm the selector picks per collective at a ladder of sizes.
json::Value hostPlanJson(const ridgeComm* c, const std::vector<plan::HostPlacement>& places,
                         const std::string& source, const std::string& rules) {
  json::Value doc = json::Value::object();
  doc.set("format", "ridge-plan");
  doc.set("version", 1);
  doc.set("nranks", c->nranks);
  doc.set("source", source);
  doc.set("socketCrossings", plan::hostSocketCrossings(c->ringOrder, places));
  json::Value where = json::Value::array();
  for (int r = 0; r < c->nranks; ++r) {
    json::Value p = json::Value::object();
    p.set("rank", r);
    p.set("host", c->peers[static_cast<size_t>(r)].hostName);
    p.set("package", places[static_cast<size_t>(r)].package);
    p.set("numa", places[static_cast<size_t>(r)].numa);
    where.push(std::move(p));
  }
  doc.set("placements", std::move(where));
  json::Value channels = json::Value::array();
  json::Value ring = json::Value::object();
  ring.set("kind", "ring");
  json::Value ranks = json::Value::array();
  for (int r : c->ringOrder) ranks.push(r);
  ring.set("ranks", std::move(ranks));
  channels.push(std::move(ring));
  doc.set("channels", std::move(channels));
  doc.set("algoRules", rules);
  json::Value algos = json::Value::array();
  for (int t = 0; t < plan::kCollCount; ++t) {
    for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 8) {
      json::Value a = json::Value::object();
      a.set("collective", collTypeName(static_cast<CollType>(t)));
      a.set("bytes", static_cast<uint64_t>(bytes));
      a.set("algo", algoName(c->algos.choose(static_cast<CollType>(t), bytes)));
      algos.push(std::move(a));
    }
  }
  doc.set("algorithms", std::move(algos));
  return doc;
}

}  // namespace

Status setupHostPlan(ridgeComm* c, bool directAvailable) {
  const int P = c->nranks;
  std::vector<plan::HostPlacement> places(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    const PeerInfo& p = c->peers[static_cast<size_t>(r)];
    places[static_cast<size_t>(r)] = {p.hostHash, p.package, p.numa};
  }
  std::string source = "placement";
  std::vector<int> order;
  if (settingString(Setting::PLAN_HOST_ORDER) == "rank") {
    order.resize(static_cast<size_t>(P));
    std::iota(order.begin(), order.end(), 0);
    source = "rank order (RIDGE_PLAN_HOST_ORDER=rank)";
  } else {
    order = plan::hostRingOrder(places);
  }
  // Rules from RIDGE_ALGO come first, so they win over a plan file's.
  std::string rules = settingString(Setting::ALGO);
  const std::string file = settingString(Setting::PLAN_FILE);
  if (!file.empty()) {
    plan::ForcedPlan forced;
    RIDGE_TRY(plan::readPlanFile(file, P, &forced));
    if (!forced.rings.empty()) {
      order = forced.rings.front();
      source = "file " + file;
    }
    if (!forced.algoRules.empty()) rules = rules.empty() ? forced.algoRules : rules + ";" + forced.algoRules;
  }
  c->ringOrder = order;
  c->ringPos.assign(static_cast<size_t>(P), 0);
  for (int i = 0; i < P; ++i) c->ringPos[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;

  AlgoDefaults defaults;
  defaults.nranks = P;
  defaults.directAvailable = directAvailable;
  defaults.allPairsMax = static_cast<size_t>(settingSize(Setting::ALLPAIRS_MAX));
  defaults.directMin = static_cast<size_t>(settingSize(Setting::DIRECT_MIN));
  defaults.directMax = static_cast<size_t>(settingSize(Setting::DIRECT_MAX));
  // The model prices one host's shared memory; the same facts on every rank decide it.
  bool oneHost = true;
  for (const plan::HostPlacement& p : places) oneHost = oneHost && p.host == places.front().host;
  defaults.fixedCrossovers = settingIsSet(Setting::ALLPAIRS_MAX) || settingIsSet(Setting::DIRECT_MIN) ||
                             settingIsSet(Setting::DIRECT_MAX) || !oneHost || settingInt(Setting::SHM) == 0;
  defaults.constants.streamMinBytes = static_cast<size_t>(settingSize(Setting::STREAM_MIN));
  Status cost = plan::parseHostConstants(settingString(Setting::HOST_COST), &defaults.constants);
  (void)cost;  // a bad entry was logged; the defaults stay
  Status algo = c->algos.configure(rules, defaults);
  (void)algo;  // malformed entries were logged and are ignored
  RIDGE_INFO("comm %s: default algorithms from %s", c->name.c_str(),
             c->algos.usesCostModel() ? "the host cost model" : "the measured crossovers");
  // Point to point: single copy from the model's crossover (RIDGE_DIRECT_MIN under the
  // measured crossovers), where every rank has peer memory.
  const size_t p2pMin = !directAvailable           ? SIZE_MAX
                        : c->algos.usesCostModel() ? plan::hostSendRecvSingleCopyMin(defaults.constants, P)
                                                   : defaults.directMin;
  setupP2pCopy(c, p2pMin);
  RIDGE_INFO("comm %s: sends of at least %zu bytes go single copy", c->name.c_str(), c->p2pCopy.minBytes);

  if (P <= 64) {
    std::string text;
    for (int r : order) {
      if (!text.empty()) text += ' ';
      text += std::to_string(r);
    }
    RIDGE_INFO("comm %s: ring %s (%s, %d socket crossings)", c->name.c_str(), text.c_str(), source.c_str(),
               plan::hostSocketCrossings(order, places));
  }
  const std::string dump = settingString(Setting::PLAN_DUMP);
  if (!dump.empty() && c->rank == 0) {
    Status s = plan::writeTextFile(dump, json::write(hostPlanJson(c, places, source, rules)) + "\n");
    if (!s.isOk()) RIDGE_WARN("RIDGE_PLAN_DUMP: %s", s.message().c_str());
  }
  return Status::ok();
}

}  // namespace ridge
