// The one-shot LL collective: what one launch does, line by line, for every collective.
//
// Every rank of the communicator runs one fused launch per operation (src/coll/device/ll_path.h
// queues it on the caller's stream). Each rank owns an LL area in device memory with one
// slot per peer and parity; `peerSlot[j]` is where this rank writes for peer j (peer j's
// slot for this rank), `mySlot[j]` where peer j's lines land here. A message of `count`
// elements is linesFor(count * elemBytes) lines; line i carries bytes [8i, 8i + 8).
//
// Phase 1 (send): for each line i this rank owns, store line i of what each peer needs from
// it, tagged with the operation's flag: the whole input (allreduce, allgather), the peer's
// block (reduce-scatter, alltoall), the root's data (broadcast; reduce: everyone's input to
// the root). Pairs that carry no data this operation still exchange one "token" line (line
// 0): every pair exchanges every operation, which is what makes two parities enough (a rank
// starts operation k + 2 only after its operation k + 1 received lines from every peer, which
// each peer sent after it had finished operation k, so nobody overwrites a slot still read).
// Phase 2 (receive): for each of the same lines, wait for every expected peer line, then
// store the output: copies, or a reduction in the bulk P2P path's order (kernels/fold_order.h:
// from the slice's owner, in rounds of kFoldSources) so that LL and bulk give the same bits.
//
// The same thread handles line i in both phases, so in place (the output over the input)
// each input line is read before it is overwritten. The functions are RIDGE_HOST_DEVICE
// templates over an environment that supplies the memory accesses and the arithmetic: the
// CUDA kernel (ll_protocol.cu: 16-byte volatile stores and loads, the device element
// arithmetic) and the emulated runtime (src/device/emulated_runtime.cpp: 8-byte
// release/acquire accesses, the host reduction) run this same logic. Kept to C++17.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/host_device.h"
#include "kernels/fold_order.h"
#include "kernels/ll_line.h"
#include "ridge/ridge.h"

namespace ridge::ll {

// Most ranks an LL collective serves (the descriptor holds a pointer per peer and phase 2 a
// payload per peer). Larger communicators take the proxy path.
constexpr int kMaxRanks = 32;

enum class CollKind : int32_t { AllReduce, ReduceScatter, Reduce, AllGather, Broadcast, AlltoAll };

// Everything one launch needs, as plain data (a kernel parameter).
struct Launch {
  CollKind kind = CollKind::AllReduce;
  int32_t rank = 0, nranks = 0, root = 0;
  int32_t type = 0;       // ridgeDataType_t
  int32_t op = 0;         // ridgeRedOp_t (reductions)
  int32_t divisor = 0;    // avg: nranks; 0 otherwise
  int32_t elemBytes = 1;  // size of one element of `type`
  uint32_t flag = 0;      // flagForStep(the communicator's LL operation number); never 0
  uint64_t count = 0;     // elements per peer message (the API's count)
  uint64_t timeoutNs = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  Line* peerSlot[kMaxRanks] = {};  // by peer: where this rank's lines for it go
  Line* mySlot[kMaxRanks] = {};    // by peer: where its lines for this rank arrive
  uint64_t statusWord = 0;         // device address of the communicator's status word (uint32)
  uint32_t statusBase = 0;         // the word's value while all is well
  // The operation's signature (issue 19): the call every rank must agree on, packed into one
  // line's payload (coll/signature.h, packedCall), exchanged with every peer on the slots' last
  // line `sigLine` (never a data line: slots have one line more than the largest message).
  uint32_t sigLine = 0;
  uint64_t signature = 0;
};

// The status word holds statusBase while all is well; a launch whose wait passed its deadline
// writes statusBase + kTimedOut, the host writes statusBase + kAborted (abort, destroy of a
// broken communicator); any other value makes every waiting launch give up. Offsets from a
// base, not fixed values: the word comes from the runtime's release-word pool, whose words
// only move forward (a stream may still hold a wait on a recycled word's older value).
// kMismatch: a peer's signature line differs from this rank's (the calls do not match).
constexpr uint32_t kTimedOut = 1, kAborted = 2, kMismatch = 3;

RIDGE_HOST_DEVICE inline size_t messageBytes(const Launch& d) {
  return size_t(d.count) * size_t(d.elemBytes);
}
RIDGE_HOST_DEVICE inline size_t messageLines(const Launch& d) {
  return linesFor(messageBytes(d));
}

// Whether rank `from` sends its data (not just a token) to rank `to` in this operation.
RIDGE_HOST_DEVICE inline bool carriesData(const Launch& d, int from, int to) {
  switch (d.kind) {
    case CollKind::Broadcast: return from == d.root;
    case CollKind::Reduce: return to == d.root;
    default: return true;
  }
}

// Where the bytes that rank `rank` sends to `peer` start in its send buffer.
RIDGE_HOST_DEVICE inline const unsigned char* sendBlock(const Launch& d, int peer) {
  const unsigned char* s = static_cast<const unsigned char*>(d.send);
  return d.kind == CollKind::ReduceScatter || d.kind == CollKind::AlltoAll
             ? s + size_t(peer) * messageBytes(d)
             : s;
}

// Phase 1 for line i: every peer's line (data or, on line 0, a token).
template <class Env>
RIDGE_HOST_DEVICE inline void sendLine(const Launch& d, size_t i, Env& env) {
  const size_t bytes = messageBytes(d);
  for (int k = 1; k < d.nranks; ++k) {
    const int j = (d.rank + k) % d.nranks;
    if (i == 0) env.store(d.peerSlot[j] + d.sigLine, encode(d.signature, d.flag));
    if (carriesData(d, d.rank, j))
      env.store(d.peerSlot[j] + i, encode(loadPayload(sendBlock(d, j), bytes, i), d.flag));
    else if (i == 0)
      env.store(d.peerSlot[j], encode(0, d.flag));
  }
}

// Line i's payload from rank j: this rank's own input, or peer j's line once it has arrived.
// False when the wait gave up.
template <class Env>
RIDGE_HOST_DEVICE inline bool payloadFrom(const Launch& d, size_t i, int j, Env& env, uint64_t* v) {
  if (j == d.rank) {
    *v = loadPayload(sendBlock(d, j), messageBytes(d), i);
    return true;
  }
  Line l;
  if (!env.wait(d.mySlot[j] + i, d.flag, &l)) return false;
  *v = payloadOf(l);
  return true;
}

// Phase 2's output for line i: waits for every expected peer data line, then stores the
// output. False when a wait gave up (timeout or abort: the status word says which). Payloads
// are consumed as they are taken, never gathered per rank: an array of one payload per rank
// would cost every thread a stack frame of kMaxRanks * 8 bytes twice over in local memory.
template <class Env>
RIDGE_HOST_DEVICE inline bool receiveOutputLine(const Launch& d, size_t i, Env& env) {
  const int n = d.nranks, r = d.rank;
  const size_t bytes = messageBytes(d);
  unsigned char* out = static_cast<unsigned char*>(d.recv);
  switch (d.kind) {
    case CollKind::AllReduce:
    case CollKind::ReduceScatter:
    case CollKind::Reduce: {
      if (d.kind == CollKind::Reduce && r != d.root) return true;
      const size_t perLine = kLinePayload / size_t(d.elemBytes);
      const size_t first = i * perLine;
      const size_t left = size_t(d.count) - first;
      const int elems = static_cast<int>(left < perLine ? left : perLine);
      // The fold starts at the rank that reduces this element on the bulk path and runs as
      // that path's reduceInto does: one reduction of up to kFoldSources sources, then rounds
      // that fold the previous result first; the divisor (avg) applies to the last round only.
      const int owner = d.kind == CollKind::AllReduce
                            ? allReduceSliceOwner(size_t(d.count), size_t(d.elemBytes), first, n)
                            : r;
      uint64_t round[kFoldSources];
      uint64_t acc = 0;
      int k = 0;
      for (int t = 0; t < n; ++t) {
        if (!payloadFrom(d, i, (owner + t) % n, env, &round[k++])) return false;
        if (k == kFoldSources || t == n - 1) {
          acc = env.reduce(round, k, elems, t == n - 1 ? d.divisor : 0);
          round[0] = acc;
          k = 1;
        }
      }
      storePayload(out, bytes, i, acc);
      return true;
    }
    case CollKind::AllGather:
    case CollKind::AlltoAll:
      for (int j = 0; j < n; ++j) {
        uint64_t v;
        if (!payloadFrom(d, i, j, env, &v)) return false;
        storePayload(out + size_t(j) * bytes, bytes, i, v);
      }
      return true;
    case CollKind::Broadcast: {
      uint64_t v;
      if (!payloadFrom(d, i, d.root, env, &v)) return false;
      storePayload(out, bytes, i, v);
      return true;
    }
  }
  return true;
}

// Phase 2 for line i: the tokens (line 0 of the pairs that carry no data this operation:
// awaited, never used), the output, then every peer line this thread consumed is zeroed in
// this rank's own slots. Zeroing keeps a slot line from holding an old flag for ever: a line
// written in operation k0 and not rewritten since (later operations being shorter) would
// otherwise look ready to operation k with flagForStep(k) == flagForStep(k0) and the same
// parity, 2^32 - 1 operations later, and pass stale data. Safe: every line a peer writes in
// operation k is awaited (so already here) in operation k, and the peer's next write to this
// slot (operation k + 2) starts only after this launch ended (the two-parity argument), which
// orders these local stores first. False when a wait gave up.
// Line 0's thread first takes every peer's signature line: one that differs from this rank's
// stops the launch (status word base + kMismatch, which also stops this rank's other waiting
// threads) before any data line is awaited, so calls of different lengths fail the same way.
template <class Env>
RIDGE_HOST_DEVICE inline bool receiveLine(const Launch& d, size_t i, Env& env) {
  const int n = d.nranks, r = d.rank;
  if (i == 0) {
    for (int k = 1; k < n; ++k) {
      const int j = (r + k) % n;
      Line l;
      if (!env.wait(d.mySlot[j] + d.sigLine, d.flag, &l)) return false;
      if (payloadOf(l) != d.signature) {
        env.fail(kMismatch);
        return false;
      }
      env.store(d.mySlot[j] + d.sigLine, encode(0, 0));
    }
    for (int k = 1; k < n; ++k) {
      const int j = (r + k) % n;
      Line l;
      if (!carriesData(d, j, r) && !env.wait(d.mySlot[j], d.flag, &l)) return false;
    }
  }
  if (!receiveOutputLine(d, i, env)) return false;
  const Line zero = encode(0, 0);
  for (int k = 1; k < n; ++k) {
    const int j = (r + k) % n;
    if (i == 0 || carriesData(d, j, r)) env.store(d.mySlot[j] + i, zero);
  }
  return true;
}

}  // namespace ridge::ll
