#include "coll/device/ll_path.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "coll/device/p2p.h"
#include "coll/signature.h"
#include "core/log.h"
#include "core/settings.h"
#include "kernels/ll_collective.h"
#include "reduce/reduce.h"

namespace ridge {

using device::DeviceRuntime;

struct LLState {
  DeviceRuntime* rt = nullptr;
  size_t maxBytes = 0;   // agreed: the smallest RIDGE_LL_MAX_BYTES
  size_t slotLines = 0;  // linesFor(maxBytes) + 1: lines of one slot (the last: the signature line)
  void* area = nullptr;  // this rank's area: nranks x 2 slots (allocDevice)
  size_t areaBytes = 0;
  std::vector<void*> peerArea;   // by rank: each peer's area as this rank addresses it
  std::vector<bool> opened;      // by rank: peerArea came from ipcOpen (closed at release)
  device::ReleaseWord status{};  // statusBase, or statusBase + ll::kTimedOut / kAborted
  uint32_t statusBase = 0;       // its value when taken (pool words only move forward)
  bool haveStatus = false;
  device::Marker* last = nullptr;  // recorded after every launch
  device::Marker* join = nullptr;  // joins a group's streams (joinLLStreams)
  ridgeStream_t lastStream = nullptr;
  // A launch whose marker could not be recorded after it: releaseLL cannot tell when it has
  // ended, so it never frees what the launch may touch.
  bool untracked = false;
  uint64_t nextOp = 0;
  uint64_t launches = 0;  // operations launched (the last one's marker is in `last`)
  uint64_t timeoutNs = 0;
};

void LLStateDeleter::operator()(LLState* s) const {
  delete s;
}

namespace {

// How long an abort waits for this rank's last LL launch to leave its stream before it leaks
// the LL memory instead (running launches stop within microseconds of the status word).
constexpr int kAbortWaitSec = 1;

// What each rank tells the others at init (fixed size: bootstrap all-gather).
struct LLInfo {
  int32_t capable;  // 1: this rank allocated and exported its area
  int32_t rank;
  int32_t badSetting;  // a BadSetting: this rank's settings are invalid (every rank fails init)
  int32_t reserved;
  uint64_t maxBytes;  // its RIDGE_LL_MAX_BYTES
  uint64_t area;      // its area's address (for peers in this process when no handle is needed)
  DeviceRuntime::IpcHandle handle;
};

enum BadSetting : int32_t { kSettingsValid = 0, kBadMode = 1, kBadMaxBytes = 2 };

const char* badSettingText(int32_t bad) {
  return bad == kBadMode ? "RIDGE_LL is not auto, on or off"
                         : "RIDGE_LL_MAX_BYTES is not a size from 8 to 1M";
}

// RIDGE_LL, lower-cased; "" when it is not auto, on or off.
std::string llMode() {
  std::string mode = settingString(Setting::LL);
  for (char& ch : mode) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return mode == "auto" || mode == "on" || mode == "off" ? mode : "";
}

// Line offset of the slot where `from`'s lines land for `parity`, in any rank's area.
size_t slotOffset(const LLState& x, int from, int parity) {
  return (size_t(from) * 2 + size_t(parity)) * x.slotLines;
}

ll::Line* slotOf(void* area, const LLState& x, int from, int parity) {
  return static_cast<ll::Line*>(area) + slotOffset(x, from, parity);
}

// Two ranks of `c` on the same device (or possibly the same: between processes a device
// without a bus id is not told apart). Separate processes: their kernels are time-sliced
// without MPS, so a spinning receiver waits for a time slice. One process: the ranks' threads
// must then never make a device-synchronizing call (cudaFree, cudaDeviceSynchronize, some
// cudaMalloc) while a peer's LL launch spins, since that call waits for the spinning kernel,
// which waits for this thread's launch; and two ranks on the NULL stream share one queue,
// where the second launch waits for the first, which waits for the second. NCCL refuses two
// ranks on one device for the same reasons.
bool ranksShareADevice(const ridgeComm* c) {
  for (int a = 0; a < c->nranks; ++a)
    for (int b = a + 1; b < c->nranks; ++b) {
      const PeerInfo &pa = c->peers[a], &pb = c->peers[b];
      if (pa.pid == pb.pid && pa.processNonce == pb.processNonce) {
        if (pa.cudaDevice == pb.cudaDevice) return true;
        continue;
      }
      const std::string busA(pa.busId, strnlen(pa.busId, sizeof pa.busId));
      const std::string busB(pb.busId, strnlen(pb.busId, sizeof pb.busId));
      if (busA.empty() || busB.empty() || busA == busB) return true;
    }
  return false;
}

// Why this rank cannot take part in LL ("" when it can).
std::string localRefusal(ridgeComm* c, DeviceRuntime* rt, const std::string& mode, bool* exportHandles) {
  if (mode == "off") return "RIDGE_LL=off";
  if (!rt || c->cudaDevice < 0) return "no device";
  if (c->nranks > ll::kMaxRanks) return "more than " + std::to_string(ll::kMaxRanks) + " ranks";
  std::string why = p2p::communicatorRefusal(c, rt, exportHandles);
  if (!why.empty()) return why;
  if (mode != "on" && ranksShareADevice(c))
    return "two ranks share a device (RIDGE_LL=on forces LL: see docs/gpu.md, \"LL collectives\", for "
           "what that asks of the caller)";
  int worstKind = 0;
  return p2p::pairsRefusalHere(c, rt, &worstKind);
}

// Zeroes the area (cudaMalloc memory is not): flag 0 is never a step's flag, so a zeroed
// line is never ready. Through an internal stream, synchronized: init only.
Status zeroArea(DeviceRuntime* rt, void* area, size_t bytes) {
  std::vector<char> zeros(bytes, 0);
  ridgeStream_t s = nullptr;
  RIDGE_TRY(rt->createStream(&s));
  Status st = rt->copy(area, zeros.data(), bytes, s);
  const Status synced = rt->synchronize(s);
  if (st.isOk()) st = synced;
  rt->destroyStream(s);
  return st;
}

// Frees what `x` holds. Only when no launch can still touch it.
void freeState(LLState& x) {
  for (size_t j = 0; j < x.peerArea.size(); ++j)
    if (x.opened[j] && x.peerArea[j]) (void)x.rt->ipcClose(x.peerArea[j]);
  x.peerArea.clear();
  x.opened.clear();
  if (x.area) x.rt->freeDevice(x.area);
  x.area = nullptr;
  if (x.last) x.rt->destroyMarker(x.last);
  if (x.join) x.rt->destroyMarker(x.join);
  x.last = x.join = nullptr;
  if (x.haveStatus) x.rt->returnReleaseWord(x.status);
  x.haveStatus = false;
}

// This rank's part: settings, the rules, the area, its handle. Leaves info->capable 0 and sets
// *why when the rules refuse; not ok when a setting is invalid or a runtime call failed.
Status prepareLocal(ridgeComm* c, DeviceRuntime* rt, LLState& x, LLInfo* info, bool* exportHandles,
                    std::string* why) {
  // Invalid settings are reported after the exchange (badSetting), so that every rank fails
  // init alike, as RIDGE_STAGING_BYTES does.
  const std::string mode = llMode();
  const std::string maxText = settingString(Setting::LL_MAX_BYTES);
  int64_t maxBytes = 0;
  const bool maxValid = parseSize(maxText, &maxBytes) && maxBytes >= int64_t(kMinLLMaxBytes) &&
                        maxBytes <= int64_t(kMaxLLMaxBytes);
  if (mode.empty() || !maxValid) {
    info->badSetting = mode.empty() ? kBadMode : kBadMaxBytes;
    *why = std::string(badSettingText(info->badSetting)) + " (RIDGE_LL='" + settingString(Setting::LL) +
           "', RIDGE_LL_MAX_BYTES='" + maxText + "')";
    return Status::ok();
  }
  info->maxBytes = static_cast<uint64_t>(maxBytes);
  *why = localRefusal(c, rt, mode, exportHandles);
  if (!why->empty()) return Status::ok();
  RIDGE_TRY(rt->bindThread(c->cudaDevice));
  // The launches happen on the caller's thread, maybe while a stream of this device waits on
  // a proxy's release word: their kernels must be loaded now (lazy loading would load them at
  // the first launch, which may wait for the device).
  RIDGE_TRY(rt->preloadKernels());
  x.slotLines = ll::linesFor(size_t(maxBytes)) + 1;
  x.areaBytes = size_t(c->nranks) * 2 * x.slotLines * sizeof(ll::Line);
  RIDGE_TRY(rt->allocDevice(x.areaBytes, &x.area));
  RIDGE_TRY(zeroArea(rt, x.area, x.areaBytes));
  if (*exportHandles) RIDGE_TRY(rt->ipcExport(x.area, &info->handle));
  info->area = reinterpret_cast<uintptr_t>(x.area);
  RIDGE_TRY(rt->takeReleaseWord(&x.status));
  x.haveStatus = true;
  x.statusBase = __atomic_load_n(x.status.host, __ATOMIC_ACQUIRE);
  RIDGE_TRY(rt->createMarker(&x.last));
  RIDGE_TRY(rt->createMarker(&x.join));
  info->capable = 1;
  return Status::ok();
}

// Opens every peer's area (agreed layout: the smallest maxBytes).
Status openPeers(ridgeComm* c, LLState& x, const std::vector<LLInfo>& all) {
  x.peerArea.assign(c->nranks, nullptr);
  x.opened.assign(c->nranks, false);
  x.peerArea[c->rank] = x.area;
  for (int j = 0; j < c->nranks; ++j) {
    if (j == c->rank) continue;
    if (p2p::isThisProcess(c->peers[j]) && !x.rt->ipcWithinProcess()) {
      x.peerArea[j] = reinterpret_cast<void*>(static_cast<uintptr_t>(all[j].area));
      continue;
    }
    RIDGE_TRY(x.rt->ipcOpen(all[j].handle, &x.peerArea[j]));
    x.opened[j] = true;
  }
  return Status::ok();
}

// Makes the communicator's device current on the calling thread for its scope and gives the
// caller's back after: launches and event records on the caller's thread must run with the
// stream's device current (CUDA fails a launch on another device's stream, and a NULL stream
// would be the current device's legacy stream), and the caller may drive several
// communicators on several devices from one thread without cudaSetDevice between calls.
class CommDeviceScope {
 public:
  CommDeviceScope(DeviceRuntime* rt, int device) : rt_(rt), previous_(rt->currentDevice()) {
    if (previous_ != device) bound_ = rt->bindThread(device);
  }
  ~CommDeviceScope() {
    if (bound_.isOk() && previous_ >= 0 && previous_ != rt_->currentDevice())
      (void)rt_->bindThread(previous_);
  }
  const Status& status() const { return bound_; }

 private:
  DeviceRuntime* rt_;
  int previous_;
  Status bound_;
};

ll::CollKind kindOf(CollType t) {
  switch (t) {
    case CollType::AllReduce: return ll::CollKind::AllReduce;
    case CollType::ReduceScatter: return ll::CollKind::ReduceScatter;
    case CollType::Reduce: return ll::CollKind::Reduce;
    case CollType::AllGather: return ll::CollKind::AllGather;
    case CollType::Broadcast: return ll::CollKind::Broadcast;
    default: return ll::CollKind::AlltoAll;
  }
}

}  // namespace

Status setupLL(ridgeComm* c) {
  DeviceRuntime* rt = device::activeRuntime();
  std::unique_ptr<LLState, LLStateDeleter> x(new LLState());
  x->rt = rt;
  LLInfo mine{};
  mine.rank = c->rank;
  bool exportHandles = false;
  std::string why;
  const Status local = prepareLocal(c, rt, *x, &mine, &exportHandles, &why);
  if (!local.isOk()) why = "rank " + std::to_string(c->rank) + ": " + local.message();
  if (!why.empty()) mine.capable = 0;
  std::vector<LLInfo> all(c->nranks);
  all[c->rank] = mine;
  Status s = c->bootstrap->allGather(all.data(), sizeof(LLInfo));
  if (!s.isOk()) {
    freeState(*x);
    return s;
  }
  size_t agreed = kMaxLLMaxBytes;
  for (const LLInfo& i : all) {
    if (i.badSetting != kSettingsValid) {
      freeState(*x);
      if (i.rank == c->rank) return makeError(ridgeInvalidArgument, "rank %d: %s", i.rank, why.c_str());
      return makeError(ridgeInvalidArgument, "rank %d's %s", i.rank, badSettingText(i.badSetting));
    }
    if (why.empty() && !i.capable) why = "rank " + std::to_string(i.rank) + " cannot take part";
    agreed = std::min(agreed, static_cast<size_t>(i.maxBytes));
  }
  int32_t ok = 0;
  if (why.empty()) {
    x->maxBytes = agreed;
    x->slotLines = ll::linesFor(agreed) + 1;
    const Status opened = openPeers(c, *x, all);
    if (opened.isOk())
      ok = 1;
    else
      why = "rank " + std::to_string(c->rank) + " could not open a peer's LL area: " + opened.message();
  }
  // Every rank confirms that it opened every area: all enable LL or none does.
  std::vector<int32_t> oks(c->nranks, 0);
  oks[c->rank] = ok;
  s = c->bootstrap->allGather(oks.data(), sizeof(int32_t));
  if (!s.isOk()) {
    freeState(*x);
    return s;
  }
  for (int j = 0; j < c->nranks && why.empty(); ++j)
    if (!oks[j]) why = "rank " + std::to_string(j) + " could not open every LL area";
  if (!why.empty()) {
    freeState(*x);
    RIDGE_INFO("comm %s: rank %d: small device collectives take the proxy path, not LL: %s", c->name.c_str(),
               c->rank, why.c_str());
    return Status::ok();
  }
  x->timeoutNs = uint64_t(c->timeoutSec) * 1000000000ull;
  RIDGE_INFO(
      "comm %s: rank %d: device collectives up to %zu bytes per peer take the LL path (%zu bytes of LL "
      "area, %s)",
      c->name.c_str(), c->rank, x->maxBytes, x->areaBytes, exportHandles ? "IPC handles" : "pointers");
  c->device->ll = std::move(x);
  return Status::ok();
}

void releaseLL(ridgeComm* c) {
  if (!c->device->ll) return;
  LLState& x = *c->device->ll;
  const bool aborted = c->aborted.load();
  const bool broken = aborted || c->asyncError.load() != ridgeSuccess;
  if (broken) __atomic_store_n(x.status.host, x.statusBase + ll::kAborted, __ATOMIC_RELEASE);
  // Running launches see the status word within microseconds; a launch still queued behind
  // other work on a user's stream may not start for long. Abort must return promptly (what
  // is not known finished is leaked); destroy waits up to the launches' own timeout.
  const auto bound = aborted ? std::chrono::seconds(kAbortWaitSec) : std::chrono::seconds(c->timeoutSec + 5);
  bool done = x.launches == 0;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!done && !x.untracked) {
    if (!x.rt->queryMarker(x.last, &done).isOk()) break;
    if (done || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!done || x.untracked) {
    RIDGE_WARN("comm %s: rank %d: an LL launch has not left its stream; its LL area is leaked, not freed",
               c->name.c_str(), c->rank);
    (void)c->device->ll.release();
    return;
  }
  if (broken) {
    // This rank's launches have ended, but a peer's may still be queued and will store its
    // lines into this rank's area when it starts (phase 1 stores before any wait): within one
    // process the freed range could already hold someone else's memory. Only a clean
    // destroy, after which every line a peer wrote was awaited here, frees the area.
    RIDGE_INFO(
        "comm %s: rank %d: communicator %s: its LL area (%zu bytes) is leaked, not freed, since a "
        "peer's launch may still write into it",
        c->name.c_str(), c->rank, aborted ? "aborted" : "broken", x.areaBytes);
    x.area = nullptr;
  }
  freeState(x);
  c->device->ll.reset();
}

bool llTakes(const ridgeComm* c, const DeviceOp& op) {
  if (!c->device->ll) return false;
  const CollArgs& a = op.args;
  if (isExchange(a.type) || a.count == 0) return false;
  const size_t es = dataTypeSize(a.dtype);
  return es != 0 && a.count <= c->device->ll->maxBytes / es;
}

Status launchLL(ridgeComm* c, DeviceRuntime* rt, const DeviceOp& op) {
  LLState& x = *c->device->ll;
  const CollArgs& a = op.args;
  ll::Launch d;
  d.kind = kindOf(a.type);
  d.rank = c->rank;
  d.nranks = c->nranks;
  d.root = a.root;
  d.type = a.dtype;
  d.op = a.op;
  d.divisor = a.op == ridgeAvg ? c->nranks : 0;
  d.elemBytes = static_cast<int32_t>(dataTypeSize(a.dtype));
  d.count = a.count;
  d.timeoutNs = x.timeoutNs;
  d.send = a.send;
  d.recv = a.recv;
  d.statusWord = x.status.deviceAddress;
  d.statusBase = x.statusBase;
  // The signature (issue 19): every rank's launch exchanges its call on the slots' last line
  // and stops with kMismatch where a peer's differs (kernels/ll_collective.h).
  d.sigLine = static_cast<uint32_t>(x.slotLines - 1);
  d.signature = packedCall(deviceCallSignature(c->rank, a.type, a.count, a.dtype, a.op, a.root));
  const int parity = static_cast<int>(x.nextOp & 1);
  d.flag = ll::flagForStep(x.nextOp);
  for (int j = 0; j < c->nranks; ++j) {
    if (j == c->rank) continue;
    d.peerSlot[j] = slotOf(x.peerArea[j], x, c->rank, parity);
    d.mySlot[j] = slotOf(x.area, x, j, parity);
  }
  const CommDeviceScope onDevice(rt, c->cudaDevice);
  Status s = onDevice.status();
  // Issue order across streams: this launch starts after the previous one left its stream.
  // Always, even on the previous launch's stream (then nearly free): a stream handle equal to
  // the last one may be a new stream that reuses a destroyed one's handle.
  if (s.isOk() && x.launches > 0) s = rt->waitMarker(op.stream, x.last);
  if (s.isOk()) s = rt->launchLLCollective(d, op.stream);
  if (s.isOk()) {
    s = rt->recordMarker(x.last, op.stream);
    x.untracked = x.untracked || !s.isOk();
  }
  if (!s.isOk()) {
    // The peers' launches wait for lines this rank will not send: the communicator is broken.
    int expected = ridgeSuccess;
    c->asyncError.compare_exchange_strong(expected, s.code());
    return Status(s.code(), "rank " + std::to_string(c->rank) + ": LL launch: " + s.message());
  }
  ++x.nextOp;
  ++x.launches;
  x.lastStream = op.stream;
  return Status::ok();
}

Status joinLLStreams(ridgeComm* c, DeviceRuntime* rt, const ridgeStream_t* streams, size_t n) {
  if (n < 2) return Status::ok();
  LLState& x = *c->device->ll;
  // One marker passed along the streams: each waits for the previous one's record and
  // records after it, so the last record follows every stream's earlier work; the first
  // stream then waits for it. (A wait takes the marker's record at the time of the call.)
  const CommDeviceScope onDevice(rt, c->cudaDevice);
  Status s = onDevice.status();
  if (s.isOk()) s = rt->recordMarker(x.join, streams[0]);
  for (size_t i = 1; i < n && s.isOk(); ++i) {
    s = rt->waitMarker(streams[i], x.join);
    if (s.isOk()) s = rt->recordMarker(x.join, streams[i]);
  }
  if (s.isOk()) s = rt->waitMarker(streams[0], x.join);
  if (!s.isOk())
    return Status(s.code(),
                  "rank " + std::to_string(c->rank) + ": joining a group's streams: " + s.message());
  return Status::ok();
}

Status leaveLLGroup(ridgeComm* c, DeviceRuntime* rt, const ridgeStream_t* streams, size_t n) {
  LLState& x = *c->device->ll;
  const CommDeviceScope onDevice(rt, c->cudaDevice);
  Status s = onDevice.status();
  for (size_t i = 0; i < n && s.isOk(); ++i)
    if (streams[i] != x.lastStream) s = rt->waitMarker(streams[i], x.last);
  if (!s.isOk())
    return Status(s.code(),
                  "rank " + std::to_string(c->rank) + ": leaving a group's streams: " + s.message());
  return Status::ok();
}

void pollLLStatus(ridgeComm* c) {
  if (!c->device->ll) return;  // an LL state always holds its status word
  const uint32_t v = __atomic_load_n(c->device->ll->status.host, __ATOMIC_ACQUIRE);
  const uint32_t what = v - c->device->ll->statusBase;
  if (what == ll::kMismatch) {
    int expected = ridgeSuccess;
    if (!c->asyncError.compare_exchange_strong(expected, ridgeInvalidUsage)) return;
    std::lock_guard<std::mutex> lock(c->lastErrorMutex);
    c->lastError = "rank " + std::to_string(c->rank) +
                   ": mismatched calls (LL path): a peer's LL collective on device memory is not this "
                   "rank's (another collective, root, count, datatype or op); the communicator is now broken "
                   "(ridgeCommGetAsyncError), create a new one";
    return;
  }
  if (what != ll::kTimedOut) return;
  int expected = ridgeSuccess;
  if (!c->asyncError.compare_exchange_strong(expected, ridgeTimeout)) return;
  std::lock_guard<std::mutex> lock(c->lastErrorMutex);
  c->lastError = "rank " + std::to_string(c->rank) +
                 ": an LL collective on device memory timed out waiting for a peer's lines (RIDGE_TIMEOUT " +
                 std::to_string(c->timeoutSec) +
                 " s; did every rank call the same collectives in the same order, all on device memory?)";
}

LLStats llStats(const ridgeComm* c) {
  LLStats s;
  if (!c->device->ll) return s;
  s.enabled = true;
  s.maxBytes = c->device->ll->maxBytes;
  s.launches = c->device->ll->launches;
  s.nextOp = c->device->ll->nextOp;
  return s;
}

void setNextLLOpForTesting(ridgeComm* c, uint64_t op) {
  // Same parity as the number it replaces: operation k + 1 must use the other slots than
  // operation k (a peer may still read k's lines), which a jump of odd length would break.
  if (c->device->ll) c->device->ll->nextOp = op + ((op ^ c->device->ll->nextOp) & 1);
}

}  // namespace ridge
