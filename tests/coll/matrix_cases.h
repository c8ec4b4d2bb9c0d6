// The collective correctness matrix as a library: the case list (every collective x every
// datatype x every reduction operator x in-place and out-of-place x counts
// {0, 1, 33, 1009, 4099, 100003, 64 MiB}) and the runner that executes a case with
// poisoned outputs and guard zones and checks it against a higher-precision reference.
// Used by tests/coll (shared memory) and by the network-transport tests, which run the
// same cases over other transports. See coll_matrix_test.cpp for the budget choices.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "rank_launcher.h"
#include "test_data.h"

namespace ridgetest {
namespace matrix {

enum Coll { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAlltoAll, kSendRecv, kNumColl };
inline const char* collName(int c) {
  static const char* n[] = {"AllReduce",     "Broadcast", "Reduce",  "AllGather",
                            "ReduceScatter", "AlltoAll",  "SendRecv"};
  return n[c];
}
inline bool isReducing(int c) {
  return c == kAllReduce || c == kReduce || c == kReduceScatter;
}

constexpr size_t kLargeBytes = 64ull << 20;
constexpr size_t kGuard = 4096;  // guard zone before and after each buffer
constexpr uint8_t kPoisonRecv = 0xA5;
constexpr uint8_t kPoisonSend = 0x5B;

struct Case {
  int coll;
  int dt;
  int op;    // reducing collectives only
  bool alt;  // in-place; for SendRecv: ring direction backwards
  size_t count;
  int root;
  uint32_t seed;
  size_t shift;  // bytes the buffers are moved off their 4 KiB alignment
  bool large;
};

inline std::string caseName(const Case& c, int n) {
  std::string s = "n" + std::to_string(n) + "/" + collName(c.coll) + "/" + dtName(c.dt);
  if (isReducing(c.coll)) s += std::string("/") + opName(c.op);
  if (c.coll == kSendRecv)
    s += c.alt ? "/ring-bwd" : "/ring-fwd";
  else
    s += c.alt ? "/inplace" : "/outofplace";
  s += "/count=" + std::to_string(c.count);
  if (c.coll == kReduce || c.coll == kBroadcast) s += "/root=" + std::to_string(c.root);
  if (c.shift) s += "/shift=" + std::to_string(c.shift);
  s += "/seed=" + fmtHex(c.seed);
  return s;
}

/** Count per rank so that the largest buffer of the call holds 64 MiB. */
inline size_t largeCount(int coll, int dt, int n) {
  size_t elems = kLargeBytes / dtSize(dt);
  if (coll == kAllGather || coll == kReduceScatter || coll == kAlltoAll) elems /= n;
  return elems;
}

/**
 * For diagnosis only (never set by ctest): RIDGE_TEST_MATRIX_EXCLUDE=SendRecv,float16 drops
 * the cases whose name contains any of the comma-separated words.
 */
inline bool excludedByEnv(const std::string& name) {
  const char* ex = std::getenv("RIDGE_TEST_MATRIX_EXCLUDE");
  if (ex == nullptr || *ex == 0) return false;
  std::string list = ex;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string word = list.substr(pos, comma - pos);
    if (!word.empty() && name.find(word) != std::string::npos) return true;
    pos = comma + 1;
  }
  return false;
}

inline std::vector<Case> buildCases(int n, bool large) {
  std::vector<Case> cases;
  auto add = [&](int coll, int dt, int op, bool alt, size_t count, int root) {
    if (coll == kSendRecv && n == 1) return;  // a rank cannot send to itself
    Case c{coll, dt, op, alt, count, root, 0, 0, large};
    const uint32_t idx = static_cast<uint32_t>(cases.size());
    c.seed = mix32(idx * 2654435761u + static_cast<uint32_t>(n) * 40503u + (large ? 7u : 0u));
    c.shift = (idx % 2) ? dtSize(dt) : 0;
    if (excludedByEnv(caseName(c, n))) return;
    cases.push_back(c);
  };
  if (!large) {
    const size_t counts[] = {0, 1, 33, 1009, 4099, 100003};
    for (size_t count : counts) {
      const bool allRoots = count <= 4099;
      for (int dt = 0; dt < ridgeNumTypes; ++dt) {
        for (int alt = 0; alt < 2; ++alt) {
          for (int coll = 0; coll < kNumColl; ++coll) {
            const int nops = isReducing(coll) ? ridgeNumOps : 1;
            for (int op = 0; op < nops; ++op) {
              if (coll == kReduce || coll == kBroadcast) {
                if (allRoots) {
                  for (int root = 0; root < n; ++root) add(coll, dt, op, alt, count, root);
                } else {
                  add(coll, dt, op, alt, count, static_cast<int>(cases.size() % n));
                }
              } else {
                add(coll, dt, op, alt, count, 0);
              }
            }
          }
        }
      }
    }
  } else {
    for (int coll = 0; coll < kNumColl; ++coll) {
      for (int dt = 0; dt < ridgeNumTypes; ++dt) {
        const bool allOps =
            isReducing(coll) && (dt == ridgeFloat32 || dt == ridgeInt32 || dt == ridgeBfloat16);
        const int nops = allOps ? ridgeNumOps : 1;
        for (int op = 0; op < nops; ++op) {
          for (int alt = 0; alt < 2; ++alt) {
            add(coll, dt, op, alt, largeCount(coll, dt, n), static_cast<int>(cases.size() % n));
          }
        }
      }
    }
  }
  return cases;
}

/** What a stretch of a buffer holds. */
enum SegKind { kPoison, kInput, kReduced };
struct Seg {
  size_t off;  // elements from the buffer start
  size_t len;
  SegKind kind;
  uint32_t key;  // kInput: whose input
  size_t base;   // index of the first element in the generated sequence
};

class CaseRunner {
 public:
  CaseRunner(ridgeComm_t comm, int rank, int n, Reporter& rep) : comm_(comm), rank_(rank), n_(n), rep_(rep) {
    areaBytes_ = kLargeBytes + 2 * kGuard + 64;
    a_ = static_cast<uint8_t*>(mapArea(areaBytes_));
    b_ = static_cast<uint8_t*>(mapArea(areaBytes_));
  }
  ~CaseRunner() {
    munmap(a_, areaBytes_);
    munmap(b_, areaBytes_);
  }
  bool ok() const { return a_ != nullptr && b_ != nullptr; }

  /** Runs one case; false when the library returned an error (the run stops then). */
  bool run(const Case& c) {
    c_ = &c;
    esz_ = dtSize(c.dt);
    name_ = caseName(c, n_);
    ops_ = &typedOps(c.dt, c.op);
    for (int r = 0; r < n_; ++r) keys_[r] = rankKey(c.seed, r);
    reducing_ = isReducing(c.coll);

    const size_t cnt = c.count;
    size_t sendCnt = cnt, recvCnt = cnt;
    if (c.coll == kAllGather) recvCnt = n_ * cnt;
    if (c.coll == kReduceScatter) sendCnt = n_ * cnt;
    if (c.coll == kAlltoAll) sendCnt = recvCnt = n_ * cnt;
    const bool inplace = c.alt && c.coll != kSendRecv;
    const int next = (rank_ + 1) % n_, prev = (rank_ + n_ - 1) % n_;
    const int sendPeer = c.alt ? prev : next, recvPeer = c.alt ? next : prev;
    const uint32_t self = keys_[rank_];

    std::vector<Seg> sendBefore, recvBefore, sendAfter, recvAfter;
    auto seg = [](size_t off, size_t len, SegKind k, uint32_t key = 0, size_t base = 0) {
      return Seg{off, len, k, key, base};
    };
    switch (c.coll) {
      case kAllReduce:
        sendBefore = {seg(0, cnt, kInput, self)};
        recvAfter = {seg(0, cnt, kReduced, 0, 0)};
        break;
      case kReduce:
        sendBefore = {seg(0, cnt, kInput, self)};
        if (rank_ == c.root)
          recvAfter = {seg(0, cnt, kReduced, 0, 0)};
        else
          recvAfter = {seg(0, cnt, inplace ? kInput : kPoison, self)};  // recvbuff ignored
        break;
      case kBroadcast:
        sendBefore = {seg(0, cnt, kInput, self)};
        recvAfter = {seg(0, cnt, kInput, keys_[c.root])};
        break;
      case kAllGather:
        sendBefore = {seg(0, cnt, kInput, self)};
        for (int j = 0; j < n_; ++j) recvAfter.push_back(seg(j * cnt, cnt, kInput, keys_[j]));
        break;
      case kReduceScatter:
        sendBefore = {seg(0, n_ * cnt, kInput, self)};
        if (inplace) {
          for (int j = 0; j < n_; ++j) {
            recvAfter.push_back(j == rank_ ? seg(j * cnt, cnt, kReduced, 0, j * cnt)
                                           : seg(j * cnt, cnt, kInput, self, j * cnt));
          }
        } else {
          recvAfter = {seg(0, cnt, kReduced, 0, rank_ * cnt)};
        }
        break;
      case kAlltoAll:
        sendBefore = {seg(0, n_ * cnt, kInput, self)};
        for (int j = 0; j < n_; ++j) recvAfter.push_back(seg(j * cnt, cnt, kInput, keys_[j], rank_ * cnt));
        break;
      case kSendRecv:
        sendBefore = {seg(0, cnt, kInput, self)};
        recvAfter = {seg(0, cnt, kInput, keys_[recvPeer])};
        break;
    }
    sendAfter = sendBefore;

    uint8_t *sendPtr, *recvPtr;
    size_t sendBytes = sendCnt * esz_, recvBytes = recvCnt * esz_;
    if (!inplace) {
      sendPtr = a_ + kGuard + c.shift;
      recvPtr = b_ + kGuard + c.shift;
      std::memset(a_, kPoisonSend, kGuard + c.shift);
      std::memset(sendPtr + sendBytes, kPoisonSend, kGuard);
      fillSegs(sendPtr, sendBefore);
      std::memset(b_, kPoisonRecv, kGuard + c.shift + recvBytes + kGuard);
    } else {
      // One region holding both buffers.
      uint8_t* region = a_ + kGuard + c.shift;
      const size_t regionCnt = std::max(sendCnt, recvCnt);
      std::memset(a_, kPoisonRecv, kGuard + c.shift + regionCnt * esz_ + kGuard);
      sendPtr = recvPtr = region;
      if (c.coll == kAllGather) {
        sendPtr = region + rank_ * cnt * esz_;
        recvBefore = {seg(rank_ * cnt, cnt, kInput, self)};
        fillSegs(region, recvBefore);
      } else if (c.coll == kReduceScatter) {
        recvPtr = region + rank_ * cnt * esz_;
        fillSegs(region, sendBefore);
      } else if (c.coll == kBroadcast && rank_ != c.root) {
        // poison stays; only the root's buffer holds input
      } else {
        fillSegs(region, sendBefore);
      }
      if (c.coll == kBroadcast && rank_ == c.root) recvAfter = {seg(0, cnt, kInput, self)};
      sendAfter.clear();
      sendBytes = recvBytes = regionCnt * esz_;
    }

    ridgeResult_t res = ridgeSuccess;
    std::string call;
    switch (c.coll) {
      case kAllReduce:
        call = "ridgeAllReduce";
        res = ridgeAllReduce(sendPtr, recvPtr, cnt, dtype(), rop(), comm_, nullptr);
        break;
      case kBroadcast:
        call = "ridgeBroadcast";
        res = ridgeBroadcast(sendPtr, recvPtr, cnt, dtype(), c.root, comm_, nullptr);
        break;
      case kReduce:
        call = "ridgeReduce";
        res = ridgeReduce(sendPtr, recvPtr, cnt, dtype(), rop(), c.root, comm_, nullptr);
        break;
      case kAllGather:
        call = "ridgeAllGather";
        res = ridgeAllGather(sendPtr, recvPtr, cnt, dtype(), comm_, nullptr);
        break;
      case kReduceScatter:
        call = "ridgeReduceScatter";
        res = ridgeReduceScatter(sendPtr, recvPtr, cnt, dtype(), rop(), comm_, nullptr);
        break;
      case kAlltoAll:
        call = "ridgeAlltoAll";
        res = ridgeAlltoAll(sendPtr, recvPtr, cnt, dtype(), comm_, nullptr);
        break;
      case kSendRecv: {
        call = "ridgeGroupStart";
        res = ridgeGroupStart();
        if (res != ridgeSuccess) break;
        ridgeResult_t s = ridgeSend(sendPtr, cnt, dtype(), sendPeer, comm_, nullptr);
        ridgeResult_t r = ridgeRecv(recvPtr, cnt, dtype(), recvPeer, comm_, nullptr);
        ridgeResult_t e = ridgeGroupEnd();
        if (s != ridgeSuccess) {
          call = "ridgeSend";
          res = s;
        } else if (r != ridgeSuccess) {
          call = "ridgeRecv";
          res = r;
        } else {
          call = "ridgeGroupEnd";
          res = e;
        }
        break;
      }
    }
    if (res != ridgeSuccess) {
      rep_.fail(name_, call + " returned " + describeResult(res, comm_));
      return false;
    }

    // Guards and contents.
    if (!inplace) {
      checkBytes(a_, kGuard + c.shift, kPoisonSend, "send guard before");
      checkBytes(sendPtr + sendBytes, kGuard, kPoisonSend, "send guard after");
      checkSegs(sendPtr, sendAfter, "sendbuff (must be unchanged)");
      checkBytes(b_, kGuard + c.shift, kPoisonRecv, "recv guard before");
      checkBytes(recvPtr + recvBytes, kGuard, kPoisonRecv, "recv guard after");
      checkSegs(recvPtr, recvAfter, "recvbuff");
    } else {
      uint8_t* region = a_ + kGuard + c.shift;
      checkBytes(a_, kGuard + c.shift, kPoisonRecv, "guard before");
      checkBytes(region + sendBytes, kGuard, kPoisonRecv, "guard after");
      checkSegs(region, recvAfter, "buffer");
    }
    return true;
  }

 private:
  static void* mapArea(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  ridgeDataType_t dtype() const { return static_cast<ridgeDataType_t>(c_->dt); }
  ridgeRedOp_t rop() const { return static_cast<ridgeRedOp_t>(c_->op); }

  void fillSegs(uint8_t* buf, const std::vector<Seg>& segs) {
    for (const Seg& s : segs) {
      uint8_t* p = buf + s.off * esz_;
      if (s.kind == kPoison)
        std::memset(p, kPoisonRecv, s.len * esz_);
      else if (reducing_)
        ops_->fill(p, s.len, s.key, s.base);
      else
        fillRawAny(esz_, p, s.len, s.key, s.base);
    }
  }
  void checkSegs(const uint8_t* buf, const std::vector<Seg>& segs, const char* what) {
    Mismatches mm;
    for (const Seg& s : segs) {
      const uint8_t* p = buf + s.off * esz_;
      if (s.kind == kPoison) {
        for (size_t i = 0; i < s.len * esz_; ++i) {
          if (p[i] != kPoisonRecv) {
            mm.note();
            mm.add(s.off + i / esz_, "byte " + fmtHex(p[i]), "untouched poison");
            break;
          }
        }
      } else if (s.kind == kInput) {
        if (reducing_)
          ops_->checkIn(p, s.len, s.key, s.base, s.off, mm);
        else
          checkRawAny(esz_, p, s.len, s.key, s.base, s.off, mm);
      } else {
        ops_->checkRed(p, s.len, keys_.data(), n_, s.base, s.off, mm);
      }
    }
    if (mm.count) {
      rep_.fail(name_,
                std::string(what) + ": " + std::to_string(mm.count) + " wrong elements, first: " + mm.text);
    }
  }
  void checkBytes(const uint8_t* p, size_t len, uint8_t poison, const char* what) {
    for (size_t i = 0; i < len; ++i) {
      if (p[i] != poison) {
        rep_.fail(name_, std::string(what) + " overwritten at byte " + std::to_string(i) + " of " +
                             std::to_string(len) + " (value " + fmtHex(p[i]) + ")");
        return;
      }
    }
  }

  ridgeComm_t comm_;
  int rank_, n_;
  Reporter& rep_;
  size_t areaBytes_ = 0;
  uint8_t* a_ = nullptr;
  uint8_t* b_ = nullptr;
  const Case* c_ = nullptr;
  size_t esz_ = 0;
  std::string name_;
  const TypedOps* ops_ = nullptr;
  std::array<uint32_t, 8> keys_{};
  bool reducing_ = false;
};

/**
 * Runs the size class's cases (those `keep` accepts, when given) on an initialised
 * communicator, reports per-collective times from rank 0, and destroys the communicator.
 */
inline int runCases(ridgeComm_t comm, int rank, int n, bool large, Reporter& rep,
                    const std::function<bool(const Case&)>& keep = nullptr) {
  std::vector<Case> cases = buildCases(n, large);
  if (keep)
    cases.erase(std::remove_if(cases.begin(), cases.end(), [&](const Case& c) { return !keep(c); }),
                cases.end());
  CaseRunner runner(comm, rank, n, rep);
  if (!runner.ok()) {
    rep.fail("rank " + std::to_string(rank), "cannot map test buffers");
    return 3;
  }
  std::map<std::string, std::pair<double, int>> perColl;
  const double t0 = nowSec();
  size_t done = 0;
  for (const Case& c : cases) {
    const double tc = nowSec();
    rep.line("CASE " + caseName(c, n));  // the last one is shown if this rank crashes
    if (!runner.run(c)) break;           // the communicator may be broken: stop this rank
    ++done;
    auto& pc = perColl[collName(c.coll)];
    pc.first += nowSec() - tc;
    pc.second += 1;
  }
  if (done != cases.size()) {
    rep.fail("rank " + std::to_string(rank),
             "stopped after " + std::to_string(done) + " of " + std::to_string(cases.size()) + " cases");
  }
  if (rank == 0) {
    std::string t = "n=" + std::to_string(n) + (large ? " 64MiB" : " small") + ": " + std::to_string(done) +
                    " cases in " + fmtD(nowSec() - t0) + " s;";
    for (auto& [k, v] : perColl) t += " " + k + " " + fmtD(v.first) + "s/" + std::to_string(v.second);
    rep.info(t);
  }
  ridgeResult_t r = ridgeCommDestroy(comm);
  if (r != ridgeSuccess) rep.fail("rank " + std::to_string(rank), "ridgeCommDestroy: " + describeResult(r));
  return 0;
}

inline int matrixBody(int rank, int n, const ridgeUniqueId& id, bool large, Reporter& rep) {
  ridgeComm_t comm = initRank(n, id, rank, rep);
  if (!comm) return 2;
  return runCases(comm, rank, n, large, rep);
}

}  // namespace matrix
}  // namespace ridgetest
