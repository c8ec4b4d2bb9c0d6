// The host collectives' cost model (host_cost.h). Each formula follows the algorithm's passes
// in docs/algorithms.md: which rank does what per chunk, and how many hand-offs the first
// chunk waits for.
#include "plan/host_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "core/settings.h"

namespace ridge::plan {

const char* hostAlgoName(HostAlgo a) {
  switch (a) {
    case HostAlgo::AllPairs: return "allpairs";
    case HostAlgo::Ring: return "ring";
    case HostAlgo::Direct: return "direct";
    case HostAlgo::Tree: return "tree";
  }
  return "?";
}

HostTreeLinks hostTreeLinks(int nranks, int pos) {
  HostTreeLinks t;
  int lo = 0, hi = nranks;
  // Descend from the root: O(depth), no allocation (the collectives call it per call).
  while (lo < hi) {
    const int rest = hi - lo - 1;
    const int mid = lo + 1 + (rest + 1) / 2;  // the second child's range starts here
    if (pos == lo) {
      if (rest > 0) t.children[t.childCount++] = lo + 1;
      if (mid < hi) t.children[t.childCount++] = mid;
      return t;
    }
    t.parent = lo;
    ++t.depth;
    if (pos < mid) {
      lo = lo + 1;
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return HostTreeLinks{};  // pos out of range
}

int hostTreeDepth(int nranks) {
  int depth = 0;
  while ((2 << depth) <= nranks) ++depth;  // floor(log2(nranks))
  return nranks > 1 ? depth : 0;
}

bool hostAlgoAvailable(Coll coll, HostAlgo algo, bool direct) {
  switch (algo) {
    case HostAlgo::AllPairs: return true;
    case HostAlgo::Ring: return coll != Coll::AlltoAll;
    // All-to-all's direct form reads each peer's block straight into the output (in place,
    // pairs swap chunks instead: src/coll/algorithms.cpp).
    case HostAlgo::Direct: return direct;
    case HostAlgo::Tree: return coll == Coll::AllReduce || coll == Coll::Reduce || coll == Coll::Broadcast;
  }
  return false;
}

namespace {

// Per-byte costs (ns per byte) for one call, blended between the cache and the memory
// regime by the share of the working set the cache holds.
struct PerByte {
  double copy, reduce2, cross, cmaRead, cmaWrite;
  double copyStreamed;  // a copy whose destination is written with non-temporal stores
  // Reduction of `sources` inputs into one output: (sources + 1) bytes of traffic per
  // output byte against the 3 of the measured two-source rate.
  double reduce(int sources) const { return reduce2 * (sources + 1) / 3.0; }
};

PerByte perByte(const HostConstants& k, double workingSetBytes, bool streamedOutput) {
  const double inCache = workingSetBytes <= k.cacheBytes ? 1.0 : k.cacheBytes / workingSetBytes;
  auto blend = [&](double cacheGBs, double memoryGBs) {
    return inCache / cacheGBs + (1 - inCache) / memoryGBs;
  };
  PerByte p{};
  p.copy = blend(k.cache.copyGBs, k.memory.copyGBs);
  p.reduce2 = blend(k.cache.reduceGBs, k.memory.reduceGBs);
  p.cross = inCache * k.cache.crossNsPerB + (1 - inCache) * k.memory.crossNsPerB;
  p.cmaRead = blend(k.cache.cmaReadGBs, k.memory.cmaReadGBs);
  p.cmaWrite = blend(k.cache.cmaWriteGBs, k.memory.cmaWriteGBs);
  // A copy from memory reads the source, reads the destination line for ownership and
  // writes it back; non-temporal stores skip the middle one: 2 of 3.
  p.copyStreamed =
      streamedOutput ? inCache / k.cache.copyGBs + (1 - inCache) * (2.0 / 3.0) / k.memory.copyGBs : p.copy;
  return p;
}

double chunks(double bytes, size_t chunk) {
  return bytes <= 0 ? 0 : std::ceil(bytes / static_cast<double>(chunk));
}

// hostBroadcastRootShare with the per-byte costs of the call already blended.
double broadcastRootShare(const HostConstants& k, const PerByte& c, double P, double N, bool rootCopies) {
  if (P < 2 || N <= 0) return 0;
  // Root: (P - 1) f N written + N copied; a non-root: (1 - f) N read.
  const double f = (c.cmaRead - (rootCopies ? c.copy : 0)) / ((P - 1) * c.cmaWrite + c.cmaRead);
  if (f <= 0 || f * N * c.cmaRead * 1e-3 < k.cmaCallUs) return 0;
  return std::min(f, 1.0);
}

}  // namespace

double hostAlgoTimeUs(const HostConstants& k, Coll coll, HostAlgo algo, int nranks, size_t bytes,
                      bool direct) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (!hostAlgoAvailable(coll, algo, direct)) return kInf;
  const double P = std::max(1, nranks), N = static_cast<double>(bytes), s = k.stepUs;
  if (P <= 1) return k.callUs + N * perByte(k, 2 * N, false).copy * 1e-3;
  // Bytes every rank touches (inputs and outputs), all ranks together.
  double perRank = 2 * N;
  if (coll == Coll::AllGather || coll == Coll::ReduceScatter) perRank = (P + 1) * N;
  if (coll == Coll::AlltoAll) perRank = 2 * P * N;
  const bool streamed = coll == Coll::AllReduce && bytes >= k.streamMinBytes;
  const PerByte c = perByte(k, P * perRank, streamed);
  const int depth = hostTreeDepth(nranks);
  const double kids = nranks > 2 ? 2 : 1;  // children of an inner rank
  double latencyUs = 0, cmaCalls = 0, workNsPerB = 0;
  double fillBytes = 0;  // bytes copied before the pipeline runs (its first chunk)
  // Shared shapes: all-pairs reductions copy the chunk into P - 1 peers' slots and reduce P
  // sources, P - 1 of them written by other cores; direct reads of whole buffers read
  // N from each of P - 1 peers in CMA chunks, then `extra` per byte.
  auto allPairsReduction = [&] {
    latencyUs = s;
    workNsPerB = (P - 1) * (c.copy + c.cross) + c.reduce(static_cast<int>(P));
  };
  auto directReads = [&](double extra) {
    latencyUs = 2 * s;
    cmaCalls = (P - 1) * chunks(N, k.cmaChunkBytes);
    workNsPerB = (P - 1) * c.cmaRead + extra;
  };
  switch (coll) {
    case Coll::AllReduce:
      switch (algo) {
        case HostAlgo::AllPairs: allPairsReduction(); break;
        case HostAlgo::Ring: {
          // Blocks of N / P: one copy in, P - 1 fused receive-reduce-sends, the finished
          // block out, P - 1 all-gather receives to the output of which P - 2 forwarded.
          latencyUs = 2 * (P - 1) * s;
          const double out = c.copyStreamed;
          workNsPerB = (c.copy + out + (P - 1) * (c.reduce(2) + c.cross) + (P - 1) * (out + c.cross) +
                        (P - 2) * (c.copy + c.cross)) /
                       P;
          break;
        }
        case HostAlgo::Direct:
          // Own slice of N / P: read it from P - 1 peers, reduce P sources, write it into
          // P - 1 peers' outputs and the own; the address exchange and the done message.
          latencyUs = 2 * s;
          cmaCalls = 2 * (P - 1) * chunks(N / P, k.cmaChunkBytes);
          workNsPerB =
              ((P - 1) * c.cmaRead + c.reduce(static_cast<int>(P)) + (P - 1) * c.cmaWrite + c.copy) / P;
          break;
        case HostAlgo::Tree:
          // Pipelined up and down the tree; an inner rank reduces its input with its
          // children's partial sums, then forwards the result to its children and output.
          latencyUs = 2 * depth * s;
          workNsPerB = c.reduce(static_cast<int>(kids) + 1) + kids * c.cross + (kids + 1) * c.copy + c.cross;
          break;
      }
      break;
    case Coll::Reduce:
      switch (algo) {
        case HostAlgo::AllPairs:
          latencyUs = s;  // senders copy while the root reduces P sources
          workNsPerB = std::max(c.copy, c.reduce(static_cast<int>(P)) + (P - 1) * c.cross);
          break;
        case HostAlgo::Ring:  // a chain ending at the root
          latencyUs = (P - 1) * s;
          workNsPerB = std::max(c.copy, c.reduce(2) + c.cross);
          break;
        case HostAlgo::Direct: directReads(c.reduce(static_cast<int>(P))); break;
        case HostAlgo::Tree:
          latencyUs = depth * s;
          workNsPerB = c.reduce(static_cast<int>(kids) + 1) + kids * c.cross;
          break;
      }
      break;
    case Coll::Broadcast:
      switch (algo) {
        case HostAlgo::AllPairs:
          // Receivers copy a chunk out while the root copies the next one in, but nobody
          // copies out the first chunk before the root has copied it in: one chunk's copy
          // is not overlapped (below).
          latencyUs = s;
          workNsPerB = std::max((P - 1) * c.copy, c.copy + c.cross);
          fillBytes = std::min(N, static_cast<double>(k.slotBytes));
          break;
        case HostAlgo::Ring:  // a chain from the root; inner ranks forward and copy out
          latencyUs = (P - 1) * s;
          workNsPerB = (P > 2 ? 2 * c.copy : c.copy) + c.cross;
          break;
        case HostAlgo::Direct: {
          // The root writes a share of every peer's output while the peers read the rest
          // (priced out of place: the root's own copy counts).
          const double f = broadcastRootShare(k, c, P, N, true);
          latencyUs = 2 * s;
          cmaCalls = chunks((1 - f) * N, k.cmaChunkBytes) + (f > 0 ? 1 : 0);
          workNsPerB = std::max((P - 1) * f * c.cmaWrite + c.copy, (1 - f) * c.cmaRead);
          break;
        }
        case HostAlgo::Tree:
          latencyUs = depth * s;
          workNsPerB = (kids + 1) * c.copy + c.cross;
          break;
      }
      break;
    case Coll::AllGather:
      switch (algo) {
        case HostAlgo::AllPairs:
          latencyUs = s;
          workNsPerB = (P - 1) * c.copy + (P - 1) * (c.copy + c.cross);
          break;
        case HostAlgo::Ring:
          latencyUs = (P - 1) * s;
          workNsPerB = c.copy + (2 * P - 3) * (c.copy + c.cross);
          break;
        case HostAlgo::Direct: directReads(0); break;
        case HostAlgo::Tree: return kInf;
      }
      break;
    case Coll::ReduceScatter:
      switch (algo) {
        case HostAlgo::AllPairs: allPairsReduction(); break;
        case HostAlgo::Ring:
          latencyUs = (P - 1) * s;
          workNsPerB = c.copy + (P - 1) * (c.reduce(2) + c.cross);
          break;
        // The extra copy per byte is an empirical correction, not a derived pass: direct
        // reduce-scatter measured 1.5-2x slower than the ring from 1 MiB on 2 ranks
        // (docs/performance.md), which the reads and the reduction alone do not explain.
        case HostAlgo::Direct: directReads(c.reduce(static_cast<int>(P)) + c.copy); break;
        case HostAlgo::Tree: return kInf;
      }
      break;
    case Coll::AlltoAll:
      if (algo == HostAlgo::Direct) {
        directReads(0);  // out of place; the in-place swap costs a CMA write and a copy more
        break;
      }
      latencyUs = s;
      workNsPerB = (P - 1) * (2 * c.copy + c.cross);
      break;
  }
  return k.callUs + latencyUs + cmaCalls * k.cmaCallUs + N * workNsPerB * 1e-3 + fillBytes * c.copy * 1e-3;
}

double hostSendRecvTimeUs(const HostConstants& k, int nranks, size_t bytes, bool singleCopy) {
  const double N = static_cast<double>(bytes), s = k.stepUs;
  // Each rank's send and receive buffers, every rank at once.
  const PerByte c = perByte(k, 2 * std::max(1, nranks) * N, false);
  if (singleCopy)
    // The descriptor's hand-off, the read, and the release of the descriptor's slot back (the
    // sender sees it in the FIFO: no message, no system call; src/coll/p2p_copy.h).
    return k.callUs + 2 * s + k.cmaCallUs + N * c.cmaRead * 1e-3;
  // The own message into slots, the peer's out of them (written by another core); the
  // first chunk is copied in before anyone copies it out.
  const double fill = std::min(N, static_cast<double>(k.slotBytes)) * c.copy;
  return k.callUs + s + (N * (2 * c.copy + c.cross) + fill) * 1e-3;
}

size_t hostSendRecvSingleCopyMin(const HostConstants& k, int nranks) {
  size_t from = SIZE_MAX;
  for (size_t bytes = size_t{1} << 30; bytes >= 64; bytes /= 2) {
    if (hostSendRecvTimeUs(k, nranks, bytes, true) > hostSendRecvTimeUs(k, nranks, bytes, false)) break;
    from = bytes;
  }
  return from;
}

double hostBroadcastRootShare(const HostConstants& k, int nranks, size_t bytes, bool rootCopies) {
  const double P = std::max(1, nranks), N = static_cast<double>(bytes);
  return broadcastRootShare(k, perByte(k, P * 2 * N, false), P, N, rootCopies);
}

double hostBroadcastRootShareMapped(int nranks, bool rootCopies) {
  // broadcastRootShare with cmaRead = cmaWrite = copy: (1 - [rootCopies]) / P.
  return nranks < 2 || rootCopies ? 0 : 1.0 / nranks;
}

bool hostCopiesOnly(Coll coll) {
  return coll == Coll::Broadcast || coll == Coll::AllGather || coll == Coll::AlltoAll;
}

HostAlgo hostBestAlgo(const HostConstants& k, Coll coll, int nranks, size_t bytes, bool direct) {
  HostAlgo best = HostAlgo::AllPairs;
  double bestUs = std::numeric_limits<double>::infinity();
  for (int a = 0; a < kHostAlgoCount; ++a) {
    const double t = hostAlgoTimeUs(k, coll, static_cast<HostAlgo>(a), nranks, bytes, direct);
    // Equal work priced in a different order must not flip on rounding (all-pairs and the
    // chain are the same moves at 2 ranks).
    if (t < bestUs * (1 - 1e-9)) {
      bestUs = t;
      best = static_cast<HostAlgo>(a);
    }
  }
  return best;
}

Status parseHostConstants(const std::string& text, HostConstants* out) {
  HostConstants k = *out;
  struct Key {
    const char* name;
    double* value;
    bool size;  // a byte count with K/M/G, else a positive number
  };
  const Key keys[] = {{"step", &k.stepUs, false},
                      {"cma-call", &k.cmaCallUs, false},
                      {"call", &k.callUs, false},
                      {"copy-cache", &k.cache.copyGBs, false},
                      {"copy-memory", &k.memory.copyGBs, false},
                      {"reduce-cache", &k.cache.reduceGBs, false},
                      {"reduce-memory", &k.memory.reduceGBs, false},
                      {"cross-cache", &k.cache.crossNsPerB, false},
                      {"cross-memory", &k.memory.crossNsPerB, false},
                      {"cma-read-cache", &k.cache.cmaReadGBs, false},
                      {"cma-read-memory", &k.memory.cmaReadGBs, false},
                      {"cma-write-cache", &k.cache.cmaWriteGBs, false},
                      {"cma-write-memory", &k.memory.cmaWriteGBs, false},
                      {"cache", &k.cacheBytes, true}};
  std::stringstream ss(text);
  std::string item, bad;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    const Key* key = nullptr;
    for (const Key& x : keys)
      if (name == x.name) key = &x;
    double v = -1;
    if (key && key->size) {
      int64_t n = 0;
      if (parseSize(value, &n)) v = static_cast<double>(n);
    } else if (key && !value.empty()) {
      char* end = nullptr;
      v = std::strtod(value.c_str(), &end);
      if (*end) v = -1;
    }
    // Rates and sizes must be positive; latencies and the cross-core extra may be zero.
    const bool zeroOk =
        key && (key->value == &k.stepUs || key->value == &k.cmaCallUs || key->value == &k.callUs ||
                key->value == &k.cache.crossNsPerB || key->value == &k.memory.crossNsPerB);
    if (!key || !std::isfinite(v) || v < 0 || (v == 0 && !zeroOk)) {
      bad += (bad.empty() ? "" : ", ") + item;
      continue;
    }
    *key->value = v;
  }
  if (!bad.empty())
    return makeError(ridgeInvalidArgument,
                     "host cost constants: bad entries [%s]; expected key=value with keys step, cma-call, "
                     "call (us), copy-, reduce-, cma-read-, cma-write-cache/-memory (GB/s), cross-cache, "
                     "cross-memory (ns per byte), cache (bytes)",
                     bad.c_str());
  *out = k;
  return Status::ok();
}

}  // namespace ridge::plan
