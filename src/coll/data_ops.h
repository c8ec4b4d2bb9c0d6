// The data-ops seam: how the algorithms (coll/algorithms.cpp) copy and reduce payload (never
// control messages). Host memory, the default: memcpy, the streaming copy and the host
// reductions, inline behind one predictable branch on comm->deviceData, so the host path
// does no more per byte than before. Device memory (comm->deviceData set by the GPU proxy
// while a batch runs on the device network, docs/gpu.md): the device runtime's copy and
// reduction kernel on the proxy's internal stream, each followed by a synchronize, so that
// a slot is posted (and the NIC reads it) only once the device has written it, and a
// received slot is released only once the device has read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "coll/comm.h"
#include "core/status.h"
#include "device/runtime.h"
#include "reduce/reduce.h"
#include "reduce/stream_copy.h"

namespace ridge {

class DeviceDataOps {
 public:
  DeviceDataOps(device::DeviceRuntime* rt, ridgeStream_t stream) : rt_(rt), stream_(stream) {}
  Status copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return Status::ok();
    RIDGE_TRY(rt_->copy(dst, src, bytes, stream_));
    return rt_->synchronize(stream_);
  }
  // dst = a (op) b, then / divisor when divisor > 0 (as reduce2).
  Status reduce2(void* dst, const void* a, const void* b, size_t count, ridgeDataType_t type, ridgeRedOp_t op,
                 int divisor) {
    if (count == 0) return Status::ok();
    const void* srcs[2] = {a, b};
    RIDGE_TRY(rt_->launchReduce(dst, srcs, 2, count, type, op, divisor, stream_));
    return rt_->synchronize(stream_);
  }

 private:
  device::DeviceRuntime* rt_;
  ridgeStream_t stream_;
};

// Copies payload; `streaming`: host stores that bypass the cache (the output of a large
// collective, never read back), meaningless on the device.
inline Status dataCopy(ridgeComm* c, void* dst, const void* src, size_t bytes, bool streaming = false) {
  if (!c->deviceData) [[likely]] {
    if (streaming)
      streamCopy(dst, src, bytes);
    else
      std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  return c->deviceData->copy(dst, src, bytes);
}

inline Status dataReduce2(ridgeComm* c, void* dst, const void* a, const void* b, size_t count,
                          ridgeDataType_t type, ridgeRedOp_t op, int divisor) {
  if (!c->deviceData) [[likely]] {
    reduce2(dst, a, b, count, type, op, divisor);
    return Status::ok();
  }
  return c->deviceData->reduce2(dst, a, b, count, type, op, divisor);
}

}  // namespace ridge
