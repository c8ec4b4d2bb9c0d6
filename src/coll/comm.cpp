#include "coll/comm.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "bootstrap/bootstrap.h"
#include "coll/device/device_collectives.h"
#include "core/cpus.h"
#include "core/log.h"
#include "core/settings.h"
#include "device/runtime.h"
#include "plan/host_plan.h"
#include "topo/summary.h"

namespace ridge {

// The host summary is the same for every communicator of the process: discover once.
static const std::string& hostSummaryLine() {
  static const std::string line = [] {
    HostSummary s;
    Status st = summarizeThisHost(&s);
    return st.isOk() ? summaryToCompactString(s) : std::string("unknown");
  }();
  return line;
}

static void copyString(char* dst, size_t cap, const std::string& src) {
  size_t n = std::min(cap - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = 0;
}

Status initComm(ridgeComm* c, const ridgeUniqueId& id) {
  static std::once_flag settingsLogged;
  std::call_once(settingsLogged, logSettings);
  setLogRank(c->rank);
  registerComm(c);  // for the state dump (RIDGE_DEBUG_DUMP, ridgeCommDumpState)

  RIDGE_TRY(Bootstrap::connect(id, c->rank, c->nranks, c->timeoutSec, &c->bootstrapAborted, &c->bootstrap));

  PeerInfo me{};
  me.hostHash = hostHash();
  me.pid = getpid();
  me.processNonce = p2p::processNonce();
  me.rank = c->rank;
  me.version = RIDGE_VERSION_CODE;
  char host[64] = {0};
  gethostname(host, sizeof host - 1);
  copyString(me.hostName, sizeof me.hostName, host);
  copyString(me.topoSummary, sizeof me.topoSummary, hostSummaryLine());
  int package = -1, numa = -1;
  plan::thisProcessPlacement(&package, &numa);
  me.package = static_cast<int16_t>(package);
  me.numa = static_cast<int16_t>(numa);
  // c->cudaDevice was set by the API on the caller's thread (initRank): this may be the
  // thread of a non-blocking init, whose current device is not the caller's.
  me.cudaDevice = static_cast<int16_t>(c->cudaDevice);
  me.p2pAllowed = p2p::allowedBySettings() ? 1 : 0;
  me.deviceNetReady = deviceNetworkPossibleHere(c) ? 1 : 0;
  // Checked after the exchange, so that every rank fails alike instead of waiting for one
  // that left.
  size_t stagingBytes = 0;
  const Status stagingValid = readStagingBytes(&stagingBytes);
  me.stagingBytes = stagingValid.isOk() ? stagingBytes : 0;
  if (c->cudaDevice >= 0)
    copyString(me.busId, sizeof me.busId, device::activeRuntime()->pciBusId(c->cudaDevice));
  c->peers.assign(c->nranks, PeerInfo{});
  c->peers[c->rank] = me;
  RIDGE_TRY(c->bootstrap->allGather(c->peers.data(), sizeof(PeerInfo)));
  for (const PeerInfo& p : c->peers) {
    if (p.version != me.version)
      return makeError(ridgeInvalidUsage, "rank %d runs Ridge %u but rank %d runs %u; use one build", c->rank,
                       me.version, p.rank, p.version);
  }
  if (!stagingValid.isOk())
    return Status(stagingValid.code(), "rank " + std::to_string(c->rank) + ": " + stagingValid.message());
  c->device->stagingBytes = stagingBytes;
  for (const PeerInfo& p : c->peers) {
    if (p.stagingBytes == 0)
      return makeError(ridgeInvalidArgument,
                       "rank %d's RIDGE_STAGING_BYTES is not a size from 64K to 1G (its error says which)",
                       p.rank);
    c->device->stagingBytes = std::min(c->device->stagingBytes, static_cast<size_t>(p.stagingBytes));
  }
  RIDGE_INFO("comm %s: rank %d of %d on %s (%s)", c->name.c_str(), c->rank, c->nranks, me.hostName,
             me.topoSummary);

  TransportSetup setup;
  setup.rank = c->rank;
  setup.nranks = c->nranks;
  setup.bootstrap = c->bootstrap.get();
  setup.abortFlag = &c->aborted;
  setup.timeoutSeconds = c->timeoutSec;
  for (const PeerInfo& p : c->peers) {
    setup.hostHashOfRank.push_back(p.hostHash);
    setup.pidOfRank.push_back(p.pid);
  }
  // Every rank takes the same decisions from the same all-gathered data: which pairs
  // are reachable, and which transports to create (creation is collective).
  const auto& tables = registeredTransports();
  for (int a = 0; a < c->nranks; ++a) {
    for (int b = a + 1; b < c->nranks; ++b) {
      bool reachable = false;
      for (const TransportTable* t : tables) reachable = reachable || t->canConnect(setup, a, b);
      if (!reachable)
        return makeError(ridgeInvalidUsage,
                         "ranks %d (%s) and %d (%s) are on different hosts and no transport connects "
                         "them (check RIDGE_NET and RIDGE_SHM)",
                         a, c->peers[a].hostName, b, c->peers[b].hostName);
    }
  }
  c->sendTo.assign(c->nranks, nullptr);
  c->recvFrom.assign(c->nranks, nullptr);
  for (const TransportTable* t : tables) {
    bool used = false;
    for (int a = 0; a < c->nranks && !used; ++a)
      for (int b = a + 1; b < c->nranks && !used; ++b) used = t->canConnect(setup, a, b);
    if (!used) continue;
    std::unique_ptr<Transport> transport;
    RIDGE_TRY(t->create(setup, &transport));
    for (int peer = 0; peer < c->nranks; ++peer) {
      if (peer == c->rank || c->sendTo[peer]) continue;
      c->sendTo[peer] = transport->sendTo(peer);
      c->recvFrom[peer] = transport->recvFrom(peer);
    }
    if (!c->waitTransport) c->waitTransport = transport.get();
    c->transports.push_back(std::move(transport));
  }
  for (int peer = 0; peer < c->nranks; ++peer) {
    if (peer != c->rank && (!c->sendTo[peer] || !c->recvFrom[peer]))
      return makeError(ridgeInternalError, "rank %d: no connector to rank %d after transport setup", c->rank,
                       peer);
  }
  RIDGE_TRY(setupDeviceCollectives(c, setup));
  c->scratchPtrs.assign(c->nranks, nullptr);
  c->peerMemory.assign(c->nranks, nullptr);
  bool direct = c->nranks > 1;
  for (int peer = 0; peer < c->nranks; ++peer) {
    if (peer == c->rank) continue;
    for (auto& t : c->transports)
      if (!c->peerMemory[peer]) c->peerMemory[peer] = t->peerMemory(peer);
    direct = direct && c->peerMemory[peer];
  }
  if (direct) {
    // Each bounce chunk stays in the L2 cache between the read and the reduction. The
    // chunks start on a page: malloc's 16-byte alignment made every 64-byte vector
    // load of the reduction and every page the kernel copies straddle two lines
    // (5-19 % more CPU time per 16 MiB allreduce in ridge-cma-variants).
    c->bounceChunk = 128 << 10;
    c->bounce.reset(static_cast<char*>(std::aligned_alloc(4096, c->bounceChunk * c->nranks)));
    if (!c->bounce) return makeError(ridgeSystemError, "rank %d: no memory for CMA bounce buffers", c->rank);
    c->peerDesc.assign(c->nranks, {});
  }
  c->streamMin = static_cast<size_t>(settingSize(Setting::STREAM_MIN));
  // Spinning only pays when every rank of the host, and every progress thread of its
  // transports, has a core of its own; otherwise the spinner burns the time slice of the
  // very thread it waits for (on 2 cores, ranks over TCP with two progress threads each
  // took 3x longer for a 1 KiB allreduce when they spun: docs/performance.md, issue 5).
  int localRanks = 0;
  for (const PeerInfo& p : c->peers) localRanks += p.hostHash == me.hostHash ? 1 : 0;
  int threadsPerRank = 1;
  for (const auto& t : c->transports) threadsPerRank += t->progressThreads();
  const int cpus = usableCpus();
  const bool oversubscribed = localRanks * threadsPerRank > cpus;
  c->spinNs = settingIsSet(Setting::SPIN_US) || !oversubscribed ? settingInt(Setting::SPIN_US) * 1000 : 0;
  // A wait on a network transport lasts tens of microseconds at least, and its bytes are
  // moved by another thread (a progress thread, or the NIC's) that needs a core: after the
  // spin, sleep at once rather than yield (measured: docs/performance.md, TCP section).
  bool network = false;
  for (const auto& t : c->transports) network = network || std::strcmp(t->name(), "shm") != 0;
  c->yieldNs = network ? 0 : 1000000;
  RIDGE_INFO("comm %s: %d ranks on this host with %d busy threads each, %d usable cores: %s", c->name.c_str(),
             localRanks, threadsPerRank, cpus,
             c->spinNs ? "spin, then yield, then sleep" : "oversubscribed, yield at once, then sleep");
  RIDGE_TRY(setupHostPlan(c, direct));
  c->asyncError.store(ridgeSuccess);
  RIDGE_INFO("comm %s: rank %d ready", c->name.c_str(), c->rank);
  return Status::ok();
}

Status finalizeComm(ridgeComm* c) {
  // Completes the queued device operations first; a batch it had to drop is finalize's error.
  Status s = finishGpuProxy(c);
  if (s.isOk() && c->bootstrap && c->asyncError.load() == ridgeSuccess) s = c->bootstrap->barrier();
  if (c->bootstrap) c->bootstrap->close();
  c->finalized = true;
  return s;
}

bool bufferRegistered(const ridgeComm* c, const void* p, size_t bytes) {
  const char* b = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(c->registrationsMutex);
  for (const auto& r : c->registrations)
    if (b >= r->base && b <= r->base + r->bytes && bytes <= static_cast<size_t>(r->base + r->bytes - b))
      return true;
  return false;
}

void freeComm(ridgeComm* c) {
  if (c->initThread.joinable()) c->initThread.join();
  unregisterComm(c);
  // Before the connectors go (coll/device/device_collectives.h says why and in which order).
  releaseDeviceCollectives(c);
  c->sendTo.clear();
  c->recvFrom.clear();
  c->transports.clear();
  if (c->bootstrap) c->bootstrap->close();
  c->bootstrap.reset();
  for (const auto& r : c->registrations)
    if (r->locked) munlock(r->base, r->bytes);
  c->magic = ridgeComm::kDeadMagic;
  delete c;
}

}  // namespace ridge
