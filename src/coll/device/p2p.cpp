#include "coll/device/p2p.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "coll/batch.h"
#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "coll/executor.h"
#include "coll/signature.h"
#include "coll/task.h"
#include "core/log.h"
#include "core/settings.h"
#include "kernels/fold_order.h"
#include "reduce/reduce.h"
#include "topo/discover.h"

namespace ridge::p2p {

using device::DeviceRuntime;

namespace {

constexpr uint32_t kDescMagic = 0x31503250u;  // "P2P1"
constexpr uint32_t kEndMagic = 0x44503250u;   // "P2PD"
// Most operations of a batch queued between two barriers (a barrier: the internal stream
// synchronized and the end messages exchanged). Bounds the mappings one segment may hold
// in the cache (each operation maps at most two buffers per peer) and the cost of the
// hazard check.
constexpr size_t kMaxSegmentOps = 16;
// Allocations whose exported handles a communicator keeps (ExportCache): a handle is 64
// bytes, and an application cycles through few buffers; more only cost re-exports.
constexpr size_t kExportCacheEntries = 64;

// One buffer as its owner shares it: the IPC handle of the allocation holding it, that
// allocation's unique id in the owner's process, and where the allocation and the buffer sit
// in the owner's address space (the buffer's offset in it is address - base).
struct BufferDesc {
  DeviceRuntime::IpcHandle handle;
  uint64_t base;        // the allocation's base (0: not shared, e.g. not used by this rank)
  uint64_t allocation;  // DeviceRuntime::allocationId (0: the owner's runtime could not tell)
  uint64_t address;     // the buffer itself (peers in the same process may use it as is)
};

// What a rank sends every peer before an operation. The first operation's descriptor of a
// batch is also the batch's vote: `eligible` says whether the sender's whole batch can go
// P2P, `batchOps` how many operations it holds.
struct OpDesc {
  uint32_t magic;
  uint32_t batchOps;
  uint32_t eligible;
  uint32_t type, dtype, op;
  int32_t root;
  uint32_t pairsOk;  // the sender's own view allows P2P between all devices (pairsRefusalHere)
  uint64_t count;
  BufferDesc send, recv;
};

static_assert(sizeof(OpDesc) == 216, "docs/transports.md gives the descriptor's size");

// The closing message: the sender finished its part (status ridgeSuccess) or failed.
struct EndMsg {
  uint32_t magic;
  int32_t status;
};

// This rank's exported IPC handles, keyed by the allocation's unique id
// (DeviceRuntime::allocationId), so that collectives on the same buffers export each
// allocation once (cudaIpcGetMemHandle is a driver call per buffer). Not keyed by address: a
// buffer freed and allocated again at the same address is another allocation, with another
// id, and is exported anew (the old handle would name the freed one). Bounded: the least
// recently used entry makes room. A handle is only bytes (copied into the descriptors), so
// an entry holds nothing to release and is evicted at once. Storage is reserved at init.
class ExportCache {
 public:
  void init(size_t capacity) {
    capacity_ = capacity;
    entries_.reserve(capacity);
  }

  // The handle of the allocation at `base` whose id is `id`; exported on a miss.
  Status handleOf(DeviceRuntime* rt, void* base, uint64_t id, DeviceRuntime::IpcHandle* out) {
    ++clock_;
    Entry* victim = nullptr;
    for (Entry& e : entries_) {
      if (e.id == id) {
        e.lastUse = clock_;
        *out = e.handle;
        hits.fetch_add(1, std::memory_order_relaxed);
        return Status::ok();
      }
      if (!victim || e.lastUse < victim->lastUse) victim = &e;
    }
    RIDGE_TRY(rt->ipcExport(base, out));
    exports.fetch_add(1, std::memory_order_relaxed);
    if (entries_.size() < capacity_) {
      entries_.push_back({});
      victim = &entries_.back();
    }
    *victim = Entry{id, *out, clock_};
    size.store(entries_.size(), std::memory_order_relaxed);
    return Status::ok();
  }

  size_t capacity() const { return capacity_; }
  std::atomic<uint64_t> exports{0}, hits{0};  // exports: every ipcExport, cached or not
  std::atomic<size_t> size{0};

 private:
  struct Entry {
    uint64_t id;
    DeviceRuntime::IpcHandle handle;
    uint64_t lastUse;
  };
  size_t capacity_ = 0;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
};

// Opened IPC mappings of peers' allocations, keyed by (peer, allocation base, allocation id),
// so that collectives on the same buffers open each handle once. The id, unique in the
// peer's process, tells a new allocation at a freed one's address without comparing 64-byte
// handles; when the peer's runtime gave no id (0), the handles are compared instead. Bounded:
// the least recently used entry not needed by the running operation makes room; an entry
// whose (peer, base) comes back as another allocation maps a freed one and is replaced at
// once. A replaced mapping is not closed then (the user's stream is parked on the running
// batch, and closing may synchronize the device): it is set aside, and closeDeferred closes
// it when the proxy is idle. At most `capacity` wait so; past that, one is closed at once (logged).
class MappingCache {
 public:
  void init(DeviceRuntime* rt, size_t capacity) {
    rt_ = rt;
    capacity_ = capacity;
    entries_.reserve(capacity);
    deferred_.reserve(capacity);
  }
  void beginOperation() { ++epoch_; }

  Status map(int peer, const BufferDesc& d, char** base) {
    Entry* victim = nullptr;
    for (Entry& e : entries_) {
      if (e.peer == peer && e.base == d.base) {
        const bool same = d.allocation != 0
                              ? e.allocation == d.allocation
                              : std::memcmp(e.handle.bytes, d.handle.bytes, sizeof d.handle.bytes) == 0;
        if (same) {
          e.lastUse = epoch_;
          hits.fetch_add(1, std::memory_order_relaxed);
          *base = static_cast<char*>(e.mapped);
          return Status::ok();
        }
        victim = &e;  // the peer freed that allocation and got a new one at the same address
      }
    }
    if (!victim && entries_.size() == capacity_) {
      for (Entry& e : entries_)
        if (e.lastUse != epoch_ && (!victim || e.lastUse < victim->lastUse)) victim = &e;
      if (!victim)
        return makeError(ridgeInternalError, "P2P mapping cache: all %zu entries in use by one operation",
                         capacity_);
    }
    void* mapped = nullptr;
    RIDGE_TRY(rt_->ipcOpen(d.handle, &mapped));
    opens.fetch_add(1, std::memory_order_relaxed);
    if (victim) {
      deferClose(*victim);
    } else {
      entries_.push_back({});
      victim = &entries_.back();
    }
    *victim = Entry{peer, d.base, d.allocation, d.handle, mapped, epoch_};
    size.store(entries_.size(), std::memory_order_relaxed);
    *base = static_cast<char*>(mapped);
    return Status::ok();
  }

  void closeDeferred() {
    for (Entry& e : deferred_) close(e);
    deferred_.clear();
    deferredCount.store(0, std::memory_order_relaxed);
  }

  void closeAll() {
    closeDeferred();
    for (Entry& e : entries_) close(e);
    entries_.clear();
    size.store(0, std::memory_order_relaxed);
  }

  size_t capacity() const { return capacity_; }
  std::atomic<uint64_t> opens{0}, hits{0}, closes{0};
  std::atomic<size_t> size{0};
  std::atomic<size_t> deferredCount{0};

 private:
  struct Entry {
    int peer;
    uint64_t base;
    uint64_t allocation;
    DeviceRuntime::IpcHandle handle;
    void* mapped;
    uint64_t lastUse;
  };
  void deferClose(const Entry& e) {
    if (deferred_.size() == capacity_) {
      RIDGE_WARN("P2P: %zu evicted mappings wait for the proxy to go idle; closing one mid-batch", capacity_);
      close(deferred_.front());
      deferred_.erase(deferred_.begin());
    }
    deferred_.push_back(e);
    deferredCount.store(deferred_.size(), std::memory_order_relaxed);
  }
  void close(Entry& e) {
    Status s = rt_->ipcClose(e.mapped);
    if (!s.isOk())
      RIDGE_WARN("P2P: closing the mapping of rank %d's allocation: %s", e.peer, s.message().c_str());
    closes.fetch_add(1, std::memory_order_relaxed);
  }

  DeviceRuntime* rt_ = nullptr;
  size_t capacity_ = 0;
  uint64_t epoch_ = 0;
  std::vector<Entry> entries_;
  std::vector<Entry> deferred_;  // evicted, to close when no stream waits (capacity_ reserved)
};

}  // namespace

struct Context {
  DeviceRuntime* rt = nullptr;
  std::atomic<bool> capable{false};  // stats() reads it from other threads
  bool exportHandles = false;        // some peer needs IPC handles (another process, or the emulator)
  bool loggedStaged = false;
  bool loggedNoAllocationIds = false;
  std::string localWhy;  // why this rank cannot do P2P by its own view (pairsRefusalHere); "" if it can
  ridgeStream_t stream = nullptr;  // internal; never the legacy default stream (null)
  MappingCache cache;
  ExportCache exports;
  std::atomic<uint64_t> p2pOps{0}, stagedBatches{0}, barriers{0}, descriptorMessages{0};
  // Sized at creation: the hot path allocates nothing.
  std::vector<OpDesc> mine;    // this rank's descriptor per operation of the batch
  std::vector<OpDesc> theirs;  // every rank's descriptors of one exchange (up to descsPerMessage each)
  std::vector<OpDesc> table;   // every rank's descriptor of every operation: table[op * P + rank]
  size_t descsPerMessage = 1;  // descriptors that fit one connector slot
  std::vector<EndMsg> ends;
  std::vector<char*> sendOf, recvOf;  // every rank's buffers as this rank addresses them
  std::vector<const void*> srcs;
};

void ContextDeleter::operator()(Context* c) const {
  delete c;
}

uint64_t processNonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    uint64_t v = 0;
    while (v == 0) v = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
    return v;
  }();
  return nonce;
}

bool isThisProcess(const PeerInfo& peer) {
  return peer.pid == getpid() && (peer.processNonce == 0 || peer.processNonce == processNonce());
}

bool allowedBySettings() {
  const std::string v = settingString(Setting::P2P);
  if (v == "off") return false;
  if (v != "auto" && !v.empty()) RIDGE_WARN("RIDGE_P2P=%s: expected auto or off; using auto", v.c_str());
  return true;
}

namespace {

// Sends `bytes` of `mine` to every peer and stores each rank's message at theirs + rank * bytes
// (this rank's own too), over the communicator's host connectors.
Task exchangeTask(ridgeComm* c, const char* mine, uint32_t bytes, char* theirs) {
  const int P = c->nranks, r = c->rank;
  std::memcpy(theirs + size_t(r) * bytes, mine, bytes);
  for (int k = 1; k < P; ++k) {
    const int j = (r + k) % P;
    void* slot = co_await AcquireSlot(c->sendTo[j]);
    std::memcpy(slot, mine, bytes);
    c->sendTo[j]->post(bytes, true);
  }
  for (int k = 1; k < P; ++k) {
    const int j = (r + P - k) % P;
    PeekSlot pk(c->recvFrom[j]);
    const void* slot = co_await pk;
    if (pk.info.bytes != bytes) {
      const uint32_t got = pk.info.bytes;
      c->recvFrom[j]->release();
      co_return makeError(ridgeInvalidUsage,
                          "rank %d: P2P: rank %d sent a %u-byte message where this rank expected its "
                          "%u-byte P2P message (do all ranks pass device memory to this collective, and "
                          "run the same collectives in the same order?)",
                          r, j, got, bytes);
    }
    std::memcpy(theirs + size_t(j) * bytes, slot, bytes);
    c->recvFrom[j]->release();
  }
  co_return Status::ok();
}

Status exchange(ridgeComm* c, const void* mine, size_t bytes, void* theirs) {
  Executor& ex = Executor::forThisThread();
  ex.spawn(c, exchangeTask(c, static_cast<const char*>(mine), static_cast<uint32_t>(bytes),
                           static_cast<char*>(theirs)));
  return ex.run();
}

// Fills `d` with how this rank's buffer `p` (of `kind`, as the API classified it) is shared
// (only when this rank `used` it: a root-only buffer elsewhere is never read). False when it
// cannot be (not device memory, not exportable): the batch is then staged.
bool describeBuffer(Context& x, const void* p, device::PointerKind kind, bool used, BufferDesc* d,
                    std::string* why) {
  std::memset(d, 0, sizeof *d);
  d->address = reinterpret_cast<uintptr_t>(p);
  if (!used) return true;
  if (kind != device::PointerKind::Device) {
    *why = std::string("a buffer is ") + device::pointerKindName(kind) + " memory (IPC needs device memory)";
    return false;
  }
  if (!x.exportHandles) return true;
  void* base = nullptr;
  size_t len = 0;
  Status s = x.rt->allocationRange(p, &base, &len);
  if (s.isOk()) {
    uint64_t id = 0;
    const Status idStatus = x.rt->allocationId(base, &id);
    if (idStatus.isOk()) {
      s = x.exports.handleOf(x.rt, base, id, &d->handle);
      d->allocation = id;
    } else {
      // No id to key a cache on safely: export every time (peers then compare handles).
      if (!x.loggedNoAllocationIds)
        RIDGE_INFO("P2P: no allocation id (%s): buffers are exported on every call, not cached",
                   idStatus.message().c_str());
      x.loggedNoAllocationIds = true;
      s = x.rt->ipcExport(base, &d->handle);
      if (s.isOk()) x.exports.exports.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!s.isOk()) {
    *why = "exporting a buffer failed: " + s.message();
    return false;
  }
  d->base = reinterpret_cast<uintptr_t>(base);
  return true;
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

// A descriptor's call as a signature (the fields every rank must agree on).
OpSignature signatureOf(const OpDesc& d, int rank) {
  return deviceCallSignature(rank, static_cast<CollType>(d.type), d.count,
                             static_cast<ridgeDataType_t>(d.dtype), static_cast<int>(d.op), d.root);
}

bool describe(Context& x, ridgeComm* c, const DeviceOp& op, OpDesc* d, std::string* why) {
  const CollArgs& a = op.args;
  std::memset(d, 0, sizeof *d);
  d->magic = kDescMagic;
  d->type = static_cast<uint32_t>(a.type);
  d->dtype = static_cast<uint32_t>(a.dtype);
  d->op = static_cast<uint32_t>(a.op);
  d->root = a.root;
  d->count = a.count;
  if (a.type == CollType::Send || a.type == CollType::Recv) {
    *why = "the batch holds send/receive operations";
    return false;
  }
  const BufferUse u = bufferUse(a, c->rank, c->nranks);
  const size_t es = dataTypeSize(a.dtype);
  if (a.type == CollType::AlltoAll && overlaps(a.send, u.sendCount * es, a.recv, u.recvCount * es)) {
    // Peers read every block of the send buffer while this rank overwrites it.
    *why = "an alltoall in place";
    return false;
  }
  return describeBuffer(x, a.send, op.sendKind, u.readsSend && u.sendCount > 0, &d->send, why) &&
         describeBuffer(x, a.recv, op.recvKind, u.writesRecv && u.recvCount > 0, &d->recv, why);
}

// How this rank addresses rank j's buffer `d`: its own pointer, a peer's pointer as is (same
// process, when the runtime allows it), or the mapping of the peer's handle.
Status addressOf(Context& x, ridgeComm* c, int j, const BufferDesc& d, char** out) {
  if (j == c->rank || (!x.exportHandles || (!x.rt->ipcWithinProcess() && isThisProcess(c->peers[j])))) {
    *out = reinterpret_cast<char*>(d.address);
    return Status::ok();
  }
  if (!d.base)
    return makeError(ridgeInternalError, "rank %d: P2P: rank %d shared no handle for a buffer it uses",
                     c->rank, j);
  char* base = nullptr;
  Status s = x.cache.map(j, d, &base);
  if (!s.isOk())
    return makeError(s.code(), "rank %d: P2P: mapping rank %d's buffer: %s", c->rank, j, s.message().c_str());
  *out = base + (d.address - d.base);
  return Status::ok();
}

// dst = op over srcs[0..n) (dst may be srcs[0]), in rounds of at most kFoldSources; the
// final divisor (average) applies once, to the last round.
Status reduceInto(Context& x, char* dst, const void** srcs, int n, size_t count, const CollArgs& a,
                  int divisor) {
  int done = std::min(n, kFoldSources);
  RIDGE_TRY(x.rt->launchReduce(dst, srcs, done, count, a.dtype, a.op, done == n ? divisor : 0, x.stream));
  while (done < n) {
    const void* round[kFoldSources];
    int k = 0;
    round[k++] = dst;
    while (k < kFoldSources && done < n) round[k++] = srcs[done++];
    RIDGE_TRY(x.rt->launchReduce(dst, round, k, count, a.dtype, a.op, done == n ? divisor : 0, x.stream));
  }
  return Status::ok();
}

// Sources for a reduction of element offset `elem` of every rank's send buffer, this rank
// first: in place its output is its own input, which the first round reads before any
// round writes.
const void** sourcesAt(Context& x, ridgeComm* c, size_t byteOffset) {
  const int P = c->nranks, r = c->rank;
  for (int k = 0; k < P; ++k) x.srcs[k] = x.sendOf[(r + k) % P] + byteOffset;
  return x.srcs.data();
}

// The device work of one operation on this rank, queued on the internal stream.
Status queueOperation(Context& x, ridgeComm* c, const CollArgs& a) {
  const int P = c->nranks, r = c->rank;
  const size_t es = dataTypeSize(a.dtype);
  const size_t bytes = a.count * es;
  const int divisor = a.op == ridgeAvg ? P : 0;
  char* const myRecv = x.recvOf[r];
  switch (a.type) {
    case CollType::AllReduce: {
      // Reduce this rank's slice from every rank's input into its own output, then copy it
      // into every peer's output. No barrier between: only this rank reads or writes slice r.
      const size_t lo = allReduceSliceStart(a.count, es, r, P),
                   hi = allReduceSliceStart(a.count, es, r + 1, P);
      if (hi == lo) return Status::ok();
      RIDGE_TRY(reduceInto(x, myRecv + lo * es, sourcesAt(x, c, lo * es), P, hi - lo, a, divisor));
      for (int k = 1; k < P; ++k) {
        const int j = (r + k) % P;
        RIDGE_TRY(x.rt->copy(x.recvOf[j] + lo * es, myRecv + lo * es, (hi - lo) * es, x.stream));
      }
      return Status::ok();
    }
    case CollType::ReduceScatter:
      return reduceInto(x, myRecv, sourcesAt(x, c, size_t(r) * bytes), P, a.count, a, divisor);
    case CollType::Reduce:
      if (r != a.root) return Status::ok();
      return reduceInto(x, myRecv, sourcesAt(x, c, 0), P, a.count, a, divisor);
    case CollType::AllGather:
      for (int k = 0; k < P; ++k) {
        const int j = (r + k) % P;
        if (myRecv + size_t(j) * bytes != x.sendOf[j])
          RIDGE_TRY(x.rt->copy(myRecv + size_t(j) * bytes, x.sendOf[j], bytes, x.stream));
      }
      return Status::ok();
    case CollType::Broadcast:
      if (myRecv == x.sendOf[a.root]) return Status::ok();
      return x.rt->copy(myRecv, x.sendOf[a.root], bytes, x.stream);
    case CollType::AlltoAll:
      for (int k = 0; k < P; ++k) {
        const int j = (r + k) % P;
        RIDGE_TRY(x.rt->copy(myRecv + size_t(j) * bytes, x.sendOf[j] + size_t(r) * bytes, bytes, x.stream));
      }
      return Status::ok();
    default: break;
  }
  return makeError(ridgeInternalError, "P2P: collective type %d", static_cast<int>(a.type));
}

// Which of rank j's buffers this rank touches in `a`.
void buffersNeeded(const CollArgs& a, int r, int j, bool* send, bool* recv) {
  *send = *recv = false;
  switch (a.type) {
    case CollType::AllReduce: *send = *recv = true; break;
    case CollType::ReduceScatter:
    case CollType::AllGather:
    case CollType::AlltoAll: *send = true; break;
    case CollType::Reduce: *send = r == a.root; break;
    case CollType::Broadcast: *send = j == a.root; break;
    default: break;
  }
  if (j == r) *send = *recv = true;  // own pointers cost nothing
}

// Ops 1..n-1's descriptors (op 0's came with the vote) to every peer, as many per message
// as a slot holds, into x.table.
Status exchangeDescriptors(Context& x, ridgeComm* c, size_t n) {
  const int P = c->nranks;
  for (int j = 0; j < P; ++j) x.table[size_t(j)] = x.theirs[size_t(j)];
  for (size_t first = 1; first < n; first += x.descsPerMessage) {
    const size_t g = std::min(x.descsPerMessage, n - first);
    RIDGE_TRY(exchange(c, &x.mine[first], g * sizeof(OpDesc), x.theirs.data()));
    x.descriptorMessages.fetch_add(1, std::memory_order_relaxed);
    for (int j = 0; j < P; ++j)
      for (size_t i = 0; i < g; ++i)
        x.table[(first + i) * size_t(P) + size_t(j)] = x.theirs[size_t(j) * g + i];
  }
  return Status::ok();
}

// The byte ranges rank j's part of operation `d` reads and writes in rank j's address space.
struct Ranges {
  uint64_t readLo = 0, readHi = 0, writeLo = 0, writeHi = 0;  // empty when lo == hi
};
Ranges rangesOf(const OpDesc& d, int j, int P) {
  CollArgs a{};
  a.type = static_cast<CollType>(d.type);
  a.count = d.count;
  a.dtype = static_cast<ridgeDataType_t>(d.dtype);
  a.op = static_cast<ridgeRedOp_t>(d.op);
  a.root = d.root;
  const BufferUse u = bufferUse(a, j, P);
  const size_t es = dataTypeSize(a.dtype);
  Ranges r;
  if (u.readsSend && u.sendCount > 0) {
    r.readLo = d.send.address;
    r.readHi = d.send.address + u.sendCount * es;
  }
  if (u.writesRecv && u.recvCount > 0) {
    r.writeLo = d.recv.address;
    r.writeHi = d.recv.address + u.recvCount * es;
  }
  return r;
}
bool intersect(uint64_t aLo, uint64_t aHi, uint64_t bLo, uint64_t bHi) {
  return aLo < aHi && bLo < bHi && aLo < bHi && bLo < aHi;
}

// Whether operation i may touch, on some rank, memory that an operation of [first, i) writes,
// or write memory that one of them reads. Within one rank the internal stream keeps the
// order; across ranks only a barrier does, so such an operation starts a new segment. Every
// range of every rank is compared with every other rank's too: ranks that are threads of one
// process share an address space, and a false alarm costs only a barrier. Computed from
// x.table alone, so every rank puts its barriers at the same operations.
bool dependsOnSegment(const Context& x, int P, size_t first, size_t i) {
  for (int j = 0; j < P; ++j) {
    const Ranges now = rangesOf(x.table[i * size_t(P) + size_t(j)], j, P);
    for (size_t k = first; k < i; ++k) {
      for (int m = 0; m < P; ++m) {
        const Ranges before = rangesOf(x.table[k * size_t(P) + size_t(m)], m, P);
        if (intersect(before.writeLo, before.writeHi, now.readLo, now.readHi) ||
            intersect(before.writeLo, before.writeHi, now.writeLo, now.writeHi) ||
            intersect(before.readLo, before.readHi, now.writeLo, now.writeHi))
          return true;
      }
    }
  }
  return false;
}

// Operation i of the batch, whose descriptors every rank has: check that they agree, map the
// peer buffers it touches and queue its device work on the internal stream.
Status queueChecked(Context& x, ridgeComm* c, const CollArgs& a, size_t i) {
  const int P = c->nranks, r = c->rank;
  const OpDesc* theirs = &x.table[i * size_t(P)];
  const OpDesc& me = x.mine[i];
  // The descriptors are the operation's signature on this path (coll/signature.h): every rank
  // compares every rank's with its own, so a mismatch fails the operation on all of them.
  const OpSignature mine = signatureOf(me, r);
  for (int j = 0; j < P; ++j) {
    const OpDesc& d = theirs[j];
    if (d.magic != kDescMagic)
      return makeError(ridgeInvalidUsage, "rank %d: %s: rank %d sent no operation descriptor (magic %08x)", r,
                       collTypeName(a.type), j, d.magic);
    const OpSignature other = signatureOf(d, j);
    if (!sameDeviceCall(mine, other)) return deviceCallMismatch(r, "P2P", mine, j, other);
  }
  if (a.count == 0) return Status::ok();  // addresses no buffer: its ranks exported none
  for (int j = 0; j < P; ++j) {
    bool send = false, recv = false;
    buffersNeeded(a, r, j, &send, &recv);
    x.sendOf[j] = x.recvOf[j] = nullptr;
    if (send) RIDGE_TRY(addressOf(x, c, j, theirs[j].send, &x.sendOf[j]));
    if (recv) RIDGE_TRY(addressOf(x, c, j, theirs[j].recv, &x.recvOf[j]));
  }
  return queueOperation(x, c, a);
}

// Closes a segment of `ops` operations: waits for this rank's device work, then one 8-byte
// message to and from every peer with each one's status (always reached, so a failing rank
// does not leave its peers waiting). Nobody goes on (and at the batch's end, releases its
// stream, which may then reuse the buffers) while a peer still reads or writes them.
Status barrier(Context& x, ridgeComm* c, Status s, size_t ops, CollType failedType) {
  const int P = c->nranks, r = c->rank;
  if (s.isOk())
    s = x.rt->synchronize(x.stream);
  else
    (void)x.rt->synchronize(x.stream);  // nothing of this segment may run after we return
  const EndMsg end{kEndMagic, static_cast<int32_t>(s.isOk() ? ridgeSuccess : s.code())};
  Status e = exchange(c, &end, sizeof end, x.ends.data());
  x.barriers.fetch_add(1, std::memory_order_relaxed);
  if (!s.isOk()) return s;
  RIDGE_TRY(e);
  for (int j = 0; j < P; ++j)
    if (x.ends[j].magic != kEndMagic || x.ends[j].status != ridgeSuccess)
      return makeError(ridgeRemoteError, "rank %d: P2P %s failed on rank %d (its error: %s)", r,
                       collTypeName(failedType), j,
                       ridgeGetErrorString(static_cast<ridgeResult_t>(x.ends[j].status)));
  x.p2pOps.fetch_add(ops, std::memory_order_relaxed);
  return Status::ok();
}

// Runs the batch's operations in segments: each segment's operations are queued back to back
// on the internal stream and closed by one barrier. A segment ends before an operation that
// depends on one of it (dependsOnSegment) and after kMaxSegmentOps.
Status runOperations(Context& x, ridgeComm* c, const DeviceOp* ops, size_t n) {
  const int P = c->nranks;
  size_t first = 0;
  Status s;
  CollType failedType = ops[0].args.type;  // the operation a failure is reported for
  x.cache.beginOperation();
  for (size_t i = 0; i < n; ++i) {
    if (i > first && (i - first == kMaxSegmentOps || dependsOnSegment(x, P, first, i))) {
      RIDGE_TRY(barrier(x, c, s, i - first, failedType));
      first = i;
      x.cache.beginOperation();
    }
    if (s.isOk()) {
      s = queueChecked(x, c, ops[i].args, i);
      if (!s.isOk()) failedType = ops[i].args.type;
    }
  }
  return barrier(x, c, s, n - first, s.isOk() ? ops[n - 1].args.type : failedType);
}

std::mutex gTopologyMutex;
std::shared_ptr<const topo::Topology> gTestTopology;

// This machine's topology, discovered on first use (only multi-GPU communicators ask); null
// when discovery fails.
std::shared_ptr<const topo::Topology> machineTopology() {
  std::lock_guard<std::mutex> lock(gTopologyMutex);
  if (gTestTopology) return gTestTopology;
  static std::shared_ptr<const topo::Topology> discovered = [] {
    auto t = std::make_shared<topo::Topology>();
    Status s = topo::discoverThisMachine(t.get());
    if (!s.isOk()) {
      RIDGE_INFO("P2P: no topology of this machine (%s); links between GPUs are not classified",
                 s.message().c_str());
      return std::shared_ptr<const topo::Topology>();
    }
    return std::shared_ptr<const topo::Topology>(std::move(t));
  }();
  return discovered;
}

// The runtime's answer for a device pair, refined by the topology when the runtime cannot
// tell the link (CUDA) and both devices have bus ids there.
DeviceRuntime::PeerLink classifyPair(DeviceRuntime* rt, int a, int b) {
  DeviceRuntime::PeerLink link = rt->peerLink(a, b);
  if (!link.allowed || link.kind != DeviceRuntime::PeerLinkKind::Unknown) return link;
  const std::string busA = rt->pciBusId(a), busB = rt->pciBusId(b);
  if (busA.empty() || busB.empty()) return link;
  if (auto t = machineTopology()) linkFromTopology(*t, busA, busB, &link);
  return link;
}

// This process's ordinal of rank j's device: found by bus id when the ranks know theirs
// (ordinals differ between processes with different CUDA_VISIBLE_DEVICES lists), else the
// ordinal rank j reported. -1: not visible to this process.
int localDeviceOf(ridgeComm* c, DeviceRuntime* rt, int j) {
  const PeerInfo& p = c->peers[j];
  const std::string bus(p.busId, strnlen(p.busId, sizeof p.busId));
  return bus.empty() ? p.cudaDevice : rt->deviceByPciBusId(bus);
}

// Decides once per communicator whether device collectives take part in P2P votes: from
// what every rank told at init, so every rank computes the same answer. What each rank
// judges from its own view (pairsRefusalHere) goes into the first vote.
Status createContext(ridgeComm* c, DeviceRuntime* rt) {
  if (c->device->p2p) return Status::ok();
  std::unique_ptr<Context, ContextDeleter> x(new Context());
  x->rt = rt;
  const int P = c->nranks, r = c->rank;
  std::string why = communicatorRefusal(c, rt, &x->exportHandles);
  for (int j = 0; j < P && why.empty(); ++j)
    if (j != r && c->sendTo[j]->slotBytes() < sizeof(OpDesc))
      why = "connector slots too small for P2P messages";
  x->capable = why.empty();
  int worstKind = static_cast<int>(DeviceRuntime::PeerLinkKind::SameDevice);
  if (x->capable) x->localWhy = pairsRefusalHere(c, rt, &worstKind);
  if (x->capable) {
    RIDGE_TRY(rt->createStream(&x->stream));
    // Every operation opens at most two buffers per peer, and a segment's mappings stay in
    // use until its barrier: room for a whole segment.
    x->cache.init(rt, std::max<size_t>(64, 2 * kMaxSegmentOps * size_t(P)));
    x->exports.init(kExportCacheEntries);
    size_t slot = SIZE_MAX;
    for (int j = 0; j < P; ++j)
      if (j != r) slot = std::min({slot, c->sendTo[j]->slotBytes(), c->recvFrom[j]->slotBytes()});
    x->descsPerMessage = std::clamp<size_t>(slot / sizeof(OpDesc), 1, kMaxDeviceBatchOps);
    x->mine.resize(kMaxDeviceBatchOps);
    x->theirs.resize(size_t(P) * x->descsPerMessage);
    x->table.resize(size_t(P) * kMaxDeviceBatchOps);
    x->ends.resize(P);
    x->sendOf.resize(P);
    x->recvOf.resize(P);
    x->srcs.resize(P);
    if (x->localWhy.empty())
      RIDGE_INFO(
          "comm %s: rank %d: device collectives take the P2P path (%d ranks on this host, links: %s, %s)",
          c->name.c_str(), r, P, device::peerLinkKindName(worstKind),
          x->exportHandles ? "IPC handles" : "pointers of this process");
    else
      RIDGE_INFO("comm %s: rank %d: no P2P from here: %s; the first device batch stages everywhere",
                 c->name.c_str(), r, x->localWhy.c_str());
  } else {
    RIDGE_INFO("comm %s: rank %d: device collectives are staged through host memory: %s", c->name.c_str(), r,
               why.c_str());
  }
  c->device->p2p = std::move(x);
  return Status::ok();
}

}  // namespace

std::string communicatorRefusal(ridgeComm* c, DeviceRuntime* rt, bool* exportHandles) {
  *exportHandles = false;
  const int P = c->nranks, r = c->rank;
  for (int j = 0; j < P; ++j) {
    const PeerInfo& p = c->peers[j];
    if (p.hostHash != c->peers[r].hostHash) return "rank " + std::to_string(j) + " is on another host";
    if (!p.p2pAllowed) return "rank " + std::to_string(j) + " set RIDGE_P2P=off";
    if (p.cudaDevice < 0) return "rank " + std::to_string(j) + " serves no device";
    if (!isThisProcess(p) || rt->ipcWithinProcess()) *exportHandles = true;
  }
  return P < 2 ? "a single rank" : "";
}

// What it checks: p2p.h. Ranks may see differently: P2P votes on the answer (OpDesc::pairsOk),
// LL agrees on it in its init exchange.
std::string pairsRefusalHere(ridgeComm* c, DeviceRuntime* rt, int* worstKind) {
  const int P = c->nranks, r = c->rank;
  std::vector<int> local(static_cast<size_t>(P));
  for (int j = 0; j < P; ++j) {
    local[j] = localDeviceOf(c, rt, j);
    if (local[j] < 0)
      return "rank " + std::to_string(j) + "'s device (bus id " + c->peers[j].busId +
             ") is not visible to rank " + std::to_string(r) + " (CUDA_VISIBLE_DEVICES?)";
  }
  for (int a = 0; a < P; ++a) {
    for (int b = 0; b < P; ++b) {
      if (a == b) continue;
      const DeviceRuntime::PeerLink link = classifyPair(rt, local[a], local[b]);
      if (!link.allowed)
        return "device " + std::to_string(local[a]) + " (rank " + std::to_string(a) +
               ") cannot access device " + std::to_string(local[b]) + " (rank " + std::to_string(b) +
               ") (the runtime refuses P2P, or the topology puts the socket link between them)";
      *worstKind = std::max(*worstKind, static_cast<int>(link.kind));
    }
  }
  // Peers that are threads of this process on other devices are reached through their own
  // pointers: this device's kernels need access to theirs.
  for (int j = 0; j < P; ++j) {
    if (j == r || !isThisProcess(c->peers[j]) || rt->ipcWithinProcess() || local[j] == local[r]) continue;
    Status s = rt->enablePeerAccess(local[j]);
    if (!s.isOk()) return "enabling access to device " + std::to_string(local[j]) + ": " + s.message();
  }
  return "";
}

bool linkFromTopology(const topo::Topology& t, const std::string& busA, const std::string& busB,
                      DeviceRuntime::PeerLink* out) {
  const int a = t.find(busA), b = t.find(busB);
  if (a < 0 || b < 0 || t.node(a).kind != topo::NodeKind::Gpu || t.node(b).kind != topo::NodeKind::Gpu)
    return false;
  if (a == b) {
    *out = {true, DeviceRuntime::PeerLinkKind::SameDevice};
    return true;
  }
  const topo::NcclClass cls = t.path(a, b).nccl;
  if (cls == topo::NcclClass::NVL || cls == topo::NcclClass::NVB)
    *out = {true, DeviceRuntime::PeerLinkKind::NvLink};
  else if (cls == topo::NcclClass::SYS)
    *out = {false, DeviceRuntime::PeerLinkKind::Pcie};
  else
    *out = {true, DeviceRuntime::PeerLinkKind::Pcie};
  return true;
}

void setTopologyForTesting(std::shared_ptr<const topo::Topology> t) {
  std::lock_guard<std::mutex> lock(gTopologyMutex);
  gTestTopology = std::move(t);
}

Status runBatch(ridgeComm* c, DeviceRuntime* rt, const DeviceOp* ops, size_t n, bool* ran) {
  *ran = false;
  if (!c->device->p2p)
    return makeError(ridgeInternalError, "rank %d: P2P: the proxy's setup prepared no context", c->rank);
  Context& x = *c->device->p2p;
  if (!x.capable || n == 0 || n > kMaxDeviceBatchOps) {
    x.stagedBatches.fetch_add(1, std::memory_order_relaxed);
    return Status::ok();
  }
  // Only batches with a collective vote: every rank's batch holds the same collectives, but
  // send/receive-only batches involve some ranks only (staged without a word to anyone).
  bool anyCollective = false;
  for (size_t i = 0; i < n; ++i)
    anyCollective =
        anyCollective || (ops[i].args.type != CollType::Send && ops[i].args.type != CollType::Recv);
  if (!anyCollective) {
    x.stagedBatches.fetch_add(1, std::memory_order_relaxed);
    return Status::ok();
  }
  // The vote: every rank sends its first descriptor, saying whether its whole batch can go.
  std::string why = x.localWhy;
  bool eligible = why.empty();
  for (size_t i = 0; i < n && eligible; ++i) eligible = describe(x, c, ops[i], &x.mine[i], &why);
  x.mine[0].eligible = eligible ? 1 : 0;
  x.mine[0].batchOps = static_cast<uint32_t>(n);
  x.mine[0].pairsOk = x.localWhy.empty() ? 1 : 0;
  RIDGE_TRY(exchange(c, &x.mine[0], sizeof(OpDesc), x.theirs.data()));
  for (int j = 0; j < c->nranks; ++j) {
    if (x.theirs[j].pairsOk) continue;
    // Some rank cannot use P2P with every device: none on this communicator from now on
    // (every rank saw the same vote, so all stop voting together).
    x.capable = false;
    x.stagedBatches.fetch_add(1, std::memory_order_relaxed);
    RIDGE_INFO("rank %d: device collectives are staged from now on: rank %d cannot use P2P with every peer",
               c->rank, j);
    return Status::ok();
  }
  for (int j = 0; j < c->nranks && eligible; ++j) {
    if (!x.theirs[j].eligible)
      why = "rank " + std::to_string(j) + "'s batch cannot go P2P";
    else if (x.theirs[j].batchOps != n)
      why = "rank " + std::to_string(j) + "'s batch holds another count of operations";
    eligible = why.empty();
  }
  if (!eligible) {
    x.stagedBatches.fetch_add(1, std::memory_order_relaxed);
    if (!x.loggedStaged) RIDGE_INFO("rank %d: a device batch is staged, not P2P: %s", c->rank, why.c_str());
    x.loggedStaged = true;
    return Status::ok();
  }
  *ran = true;
  RIDGE_TRY(exchangeDescriptors(x, c, n));
  return runOperations(x, c, ops, n);
}

Status prepareContext(ridgeComm* c, DeviceRuntime* rt) {
  return createContext(c, rt);
}

void closeDeferred(ridgeComm* c) {
  if (c->device->p2p) c->device->p2p->cache.closeDeferred();
}

void releaseContext(ridgeComm* c) {
  if (!c->device->p2p) return;
  Context& x = *c->device->p2p;
  if (x.stream) {
    (void)x.rt->synchronize(x.stream);
    x.rt->destroyStream(x.stream);
    x.stream = nullptr;
  }
  x.cache.closeAll();
}

Stats stats(const ridgeComm* c) {
  Stats s;
  if (!c->device->p2p) return s;
  const Context& x = *c->device->p2p;
  s.capable = x.capable;
  s.p2pOps = x.p2pOps.load();
  s.stagedBatches = x.stagedBatches.load();
  s.barriers = x.barriers.load();
  s.descriptorMessages = x.descriptorMessages.load();
  s.ipcExports = x.exports.exports.load();
  s.exportHits = x.exports.hits.load();
  s.exportsCached = x.exports.size.load();
  s.exportCacheCapacity = x.exports.capacity();
  s.ipcOpens = x.cache.opens.load();
  s.cacheHits = x.cache.hits.load();
  s.ipcCloses = x.cache.closes.load();
  s.closesDeferred = x.cache.deferredCount.load();
  s.mappingsOpen = x.cache.size.load();
  s.cacheCapacity = x.cache.capacity();
  return s;
}

}  // namespace ridge::p2p
