// The plan of a communicator: which ring the ring, chain and tree algorithms follow, and
// which algorithm each collective and size runs. Host ranks: the host plan (docs/planner.md,
// "Host collectives"). Ranks that all serve a GPU: the planner's plan on the topology
// (RIDGE_TOPO_FILE or this machine) with the ranks' GPUs found by bus id (docs/planner.md,
// "A communicator's plan").
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>

#include "bootstrap/bootstrap.h"
#include "coll/comm.h"
#include "core/json.h"
#include "core/log.h"
#include "core/settings.h"
#include "device/runtime.h"
#include "plan/host_plan.h"
#include "plan/plan.h"
#include "plan/plan_io.h"
#include "topo/discover.h"
#include "topo/load.h"

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

// The node topology a device plan is built on: RIDGE_TOPO_FILE, else this machine
// (discovered once per process).
Status planTopology(std::shared_ptr<const topo::Topology>* out) {
  const std::string file = settingString(Setting::TOPO_FILE);
  if (!file.empty()) {
    auto t = std::make_shared<topo::Topology>();
    Status s = topo::loadTopologyFile(file, t.get());
    if (!s.isOk()) return Status(s.code(), "RIDGE_TOPO_FILE: " + s.message());
    *out = std::move(t);
    return Status::ok();
  }
  static std::mutex mutex;
  static std::shared_ptr<const topo::Topology> discovered;
  static Status discoveryStatus;
  std::lock_guard<std::mutex> lock(mutex);
  if (!discovered && discoveryStatus.isOk()) {
    auto t = std::make_shared<topo::Topology>();
    discoveryStatus = topo::discoverThisMachine(t.get());
    if (discoveryStatus.isOk()) discovered = std::move(t);
  }
  if (!discovered) return discoveryStatus;
  *out = discovered;
  return Status::ok();
}

// Why the ranks cannot have a device plan ("" when they can): every rank serves a GPU found
// by bus id in the topology, the hosts hold equal blocks of consecutive ranks (rank r on host
// r / k, as the planner numbers them) and every host's local rank i serves the same GPU.
// Fills the request's node count, ranks per node and GPUs. Decided from all-gathered data,
// so every rank says the same unless their topologies differ (checked after).
std::string devicePlanRefusal(const ridgeComm* c, const topo::Topology& t, plan::PlanRequest* req) {
  const int P = c->nranks;
  std::vector<uint64_t> hosts;
  for (const PeerInfo& p : c->peers)
    if (hosts.empty() || hosts.back() != p.hostHash) {
      for (uint64_t h : hosts)
        if (h == p.hostHash) return "the ranks of a host are not consecutive";
      hosts.push_back(p.hostHash);
    }
  const int nodes = static_cast<int>(hosts.size());
  if (P % nodes != 0) return "hosts hold different numbers of ranks";
  const int k = P / nodes;
  std::vector<int> gpus(static_cast<size_t>(k), -1);
  for (int r = 0; r < P; ++r) {
    const PeerInfo& p = c->peers[static_cast<size_t>(r)];
    if (p.hostHash != hosts[static_cast<size_t>(r / k)]) return "hosts hold different numbers of ranks";
    const std::string bus(p.busId, strnlen(p.busId, sizeof p.busId));
    if (bus.empty()) return "rank " + std::to_string(r) + "'s device has no PCI bus id";
    const int node = t.find(bus);
    if (node < 0 || t.node(node).kind != topo::NodeKind::Gpu)
      return "rank " + std::to_string(r) + "'s device " + bus + " is not a GPU of topology '" + t.name + "'";
    int& local = gpus[static_cast<size_t>(r % k)];
    if (local >= 0 && local != node)
      return "local rank " + std::to_string(r % k) + " serves different GPUs on different hosts";
    local = node;
  }
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < i; ++j)
      if (gpus[static_cast<size_t>(i)] == gpus[static_cast<size_t>(j)])
        return "local ranks " + std::to_string(j) + " and " + std::to_string(i) + " share " +
               t.node(gpus[static_cast<size_t>(i)]).name;
  req->nranks = P;
  req->nodes = nodes;
  req->ranksPerNode = k;
  req->search.localGpus = std::move(gpus);
  return "";
}

uint64_t ringHash(const std::vector<int>& order) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ranks
  for (int r : order) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(r));
    h *= 1099511628211ull;
  }
  return h == 0 || h == ~uint64_t{0} ? 1 : h;  // 0 and all ones mean no plan and a file error
}

// The planner's plan for a communicator whose ranks all serve a device. *why says why not
// (the communicator then keeps the host plan): no topology, a rank's GPU not in it, ranks
// not laid out as the planner numbers them, or ranks that planned different rings.
// Collective: every rank of such a communicator calls it (one all-gather of 8 bytes).
Status planDevices(ridgeComm* c, std::shared_ptr<const plan::Plan>* out, std::string* why) {
  out->reset();
  why->clear();
  auto built = std::make_shared<plan::Plan>();
  std::shared_ptr<const topo::Topology> topology;
  Status s = planTopology(&topology);
  // A topology file named but unusable is the user's error: init fails, on every rank alike
  // (the all-gather below carries it), even where only one host lacks the file.
  const Status fileError = !s.isOk() && !settingString(Setting::TOPO_FILE).empty() ? s : Status::ok();
  if (!s.isOk()) *why = "no topology of this machine (" + s.message() + ")";
  plan::PlanRequest req;
  if (why->empty()) *why = devicePlanRefusal(c, *topology, &req);
  if (why->empty()) {
    s = plan::parseNetworkSpec(plan::kDefaultNetworkSpec, &req.network, &req.tcp);
    if (s.isOk()) s = plan::gdrModeFromSettings(&req.search.forcedGdrMode);
    if (s.isOk()) s = plan::buildPlan(topology, req, built.get());
    if (!s.isOk()) *why = "the planner: " + s.message();
  }
  // Every rank must run the same ring: compare what each planned (0: no plan; kFileError:
  // RIDGE_TOPO_FILE did not load there).
  constexpr uint64_t kFileError = ~uint64_t{0};
  const uint64_t mine = !fileError.isOk()                       ? kFileError
                        : why->empty() && !built->rings.empty() ? ringHash(built->rings.front().ranks)
                                                                : 0;
  std::vector<uint64_t> all(static_cast<size_t>(c->nranks), 0);
  all[static_cast<size_t>(c->rank)] = mine;
  RIDGE_TRY(c->bootstrap->allGather(all.data(), sizeof(uint64_t)));
  if (!fileError.isOk()) return fileError;
  for (int r = 0; r < c->nranks; ++r)
    if (all[static_cast<size_t>(r)] == kFileError)
      return makeError(
          ridgeInvalidArgument,
          "rank %d: RIDGE_TOPO_FILE: rank %d could not load its topology file (its error says why)", c->rank,
          r);
  for (int r = 0; r < c->nranks; ++r) {
    if (all[static_cast<size_t>(r)] == mine) continue;
    if (why->empty())
      *why =
          "rank " + std::to_string(r) +
          (all[static_cast<size_t>(r)] ? " planned another ring (another topology?)" : " has no device plan");
    return Status::ok();
  }
  if (why->empty()) *out = std::move(built);
  return Status::ok();
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
  RIDGE_TRY(device::checkDeviceSetting());
  // Rules from RIDGE_ALGO come first, so they win over a plan file's.
  std::string rules = settingString(Setting::ALGO);
  const std::string file = settingString(Setting::PLAN_FILE);
  if (!file.empty()) {
    plan::ForcedPlan forced;
    Status read = plan::readPlanFile(file, P, &forced);
    if (!read.isOk()) return Status(read.code(), "RIDGE_PLAN_FILE: " + read.message());
    order = forced.rings.front();
    source = "file " + file;
    if (!forced.algoRules.empty()) rules = rules.empty() ? forced.algoRules : rules + ";" + forced.algoRules;
  }
  // Ranks that all serve a GPU follow the planner's first ring channel (a plan file wins).
  bool allDevices = P > 1;
  for (const PeerInfo& p : c->peers) allDevices = allDevices && p.cudaDevice >= 0;
  std::shared_ptr<const plan::Plan> devicePlan;
  if (allDevices && file.empty()) {
    const auto start = std::chrono::steady_clock::now();
    std::string why;
    RIDGE_TRY(planDevices(c, &devicePlan, &why));
    if (devicePlan) {
      order = devicePlan->rings.front().ranks;
      source = "planner";
      RIDGE_INFO("comm %s: device plan on '%s': %zu ring channels, channel 0 runs (%.2f ms)", c->name.c_str(),
                 devicePlan->node->topology->name.c_str(), devicePlan->rings.size(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    } else {
      RIDGE_INFO("comm %s: no device plan, the host plan runs: %s", c->name.c_str(), why.c_str());
    }
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
    // A device plan is dumped by the writer of ridge-topo plan --json: the same bytes for the
    // same topology and ranks.
    Status s =
        plan::writeTextFile(dump, devicePlan ? plan::planJsonText(*devicePlan)
                                             : json::write(hostPlanJson(c, places, source, rules)) + "\n");
    if (!s.isOk()) RIDGE_WARN("RIDGE_PLAN_DUMP: %s", s.message().c_str());
  }
  return Status::ok();
}

}  // namespace ridge
