// One collective call as the P2P tests issue and check it, shared by the emulator tests
// (tests/coll/device) and the GPU test (tests/gpu/test_gpu_p2p.cpp): each rank's input from its key
// (test_data.h), the call, and the check of its output against the higher-precision host
// reference. The root of Reduce and Broadcast is given by the caller.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "ridge/ridge.h"
#include "test_data.h"

namespace p2ptest {

using namespace ridgetest;

enum class Op { AllReduce, ReduceScatter, Reduce, AllGather, Broadcast, AlltoAll };

inline const char* opText(Op o) {
  static const char* t[] = {"allreduce", "reducescatter", "reduce", "allgather", "broadcast", "alltoall"};
  return t[static_cast<int>(o)];
}
inline bool reduces(Op o) {
  return o == Op::AllReduce || o == Op::ReduceScatter || o == Op::Reduce;
}
// The type and reduction pairs the device tests run every collective with (fp16/bf16
// included; each reduction op once).
struct TypedCase {
  ridgeDataType_t dt;
  ridgeRedOp_t red;
};
inline constexpr TypedCase kTypedCases[] = {{ridgeFloat32, ridgeSum}, {ridgeFloat16, ridgeAvg},
                                            {ridgeInt32, ridgeProd},  {ridgeBfloat16, ridgeMax},
                                            {ridgeFloat64, ridgeMin}, {ridgeUint8, ridgeSum}};
inline constexpr Op kEveryOp[] = {Op::AllReduce, Op::ReduceScatter, Op::Reduce,
                                  Op::AllGather, Op::Broadcast,     Op::AlltoAll};

// Elements of one rank's input and output for `cnt` (the API's count) on n ranks.
inline size_t inputElems(Op o, size_t cnt, int n) {
  return o == Op::ReduceScatter || o == Op::AlltoAll ? cnt * size_t(n) : cnt;
}
inline size_t outputElems(Op o, size_t cnt, int n) {
  return o == Op::AllGather || o == Op::AlltoAll ? cnt * size_t(n) : cnt;
}

// The input of the rank whose key is `key`, inputElems() elements at `in`.
inline void fillRankInput(Op o, ridgeDataType_t dt, ridgeRedOp_t red, unsigned char* in, size_t cnt, int n,
                          uint32_t key) {
  const size_t es = dtSize(dt);
  if (reduces(o))
    typedOps(dt, red).fill(in, inputElems(o, cnt, n), key, 0);
  else if (o == Op::AlltoAll)
    for (int j = 0; j < n; ++j) fillRawAny(es, in + size_t(j) * cnt * es, cnt, key, size_t(j) * cnt);
  else
    fillRawAny(es, in, inputElems(o, cnt, n), key, 0);
}

inline ridgeResult_t issue(Op o, const void* s, void* d, size_t cnt, ridgeDataType_t dt, ridgeRedOp_t red,
                           int root, ridgeComm_t comm, ridgeStream_t stream) {
  switch (o) {
    case Op::AllReduce: return ridgeAllReduce(s, d, cnt, dt, red, comm, stream);
    case Op::ReduceScatter: return ridgeReduceScatter(s, d, cnt, dt, red, comm, stream);
    case Op::Reduce: return ridgeReduce(s, d, cnt, dt, red, root, comm, stream);
    case Op::AllGather: return ridgeAllGather(s, d, cnt, dt, comm, stream);
    case Op::Broadcast: return ridgeBroadcast(s, d, cnt, dt, root, comm, stream);
    case Op::AlltoAll: return ridgeAlltoAll(s, d, cnt, dt, comm, stream);
  }
  return ridgeInternalError;
}

// Checks rank r's output `got` (outputElems() elements) against the reference of the ranks'
// keys. Off the root, Reduce must leave the output alone: every byte still `poison` (pass
// -1 when the output is the input, in place).
inline void checkRankOutput(Op o, ridgeDataType_t dt, ridgeRedOp_t red, const unsigned char* got, size_t cnt,
                            const std::vector<uint32_t>& keys, int r, int root, int poison, Mismatches& mm) {
  const int n = static_cast<int>(keys.size());
  const size_t es = dtSize(dt);
  const TypedOps& ops = typedOps(dt, red);
  switch (o) {
    case Op::AllReduce: ops.checkRed(got, cnt, keys.data(), n, 0, 0, mm); break;
    case Op::ReduceScatter: ops.checkRed(got, cnt, keys.data(), n, size_t(r) * cnt, 0, mm); break;
    case Op::Reduce:
      if (r == root)
        ops.checkRed(got, cnt, keys.data(), n, 0, 0, mm);
      else if (poison >= 0)
        for (size_t i = 0; i < cnt * es; ++i) mm.count += got[i] != static_cast<unsigned char>(poison);
      break;
    case Op::AllGather:
      for (int j = 0; j < n; ++j)
        checkRawAny(es, got + size_t(j) * cnt * es, cnt, keys[j], 0, size_t(j) * cnt, mm);
      break;
    case Op::Broadcast: checkRawAny(es, got, cnt, keys[root], 0, 0, mm); break;
    case Op::AlltoAll:
      for (int j = 0; j < n; ++j)
        checkRawAny(es, got + size_t(j) * cnt * es, cnt, keys[j], size_t(r) * cnt, size_t(j) * cnt, mm);
      break;
  }
}

}  // namespace p2ptest
