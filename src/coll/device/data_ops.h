// The data-ops seam: how the algorithms (coll/algorithms.cpp) copy and reduce payload (never
// control messages).
//
// Host memory, the default: memcpy, the streaming copy and the host reductions, inline behind
// one predictable branch on comm->device->data, so the host path does no more per byte than
// before; dataSettled() is then ready at once and never suspends.
//
// Device memory (comm->device->data set by the GPU proxy while a batch runs on the device
// network, or while it runs a batch's sends and receives, docs/gpu.md): dataCopy and
// dataReduce2 only queue the device runtime's copy or reduction kernel on the proxy's internal
// stream and return. `co_await dataSettled(c)` then records one of a few pooled markers behind
// everything queued so far, under the next settle number, and suspends the coroutine until the
// device has passed it. Meanwhile the executor polls the connectors (completions, credits) and
// resumes the other strands, and the operations a step queued before one settle run back to
// back on the device. Strands overlap only among a batch's sends and receives (one per peer
// and direction, run after the batch's collectives, runExchanges); the collectives of a batch
// are one strand, in call order. The algorithms settle before every post (a slot is posted,
// and the NIC reads it, only once the device has written it) and before every release (a
// received slot goes back to the sender only once the device has read it). A copy that gates
// neither (the own block of an allgather or alltoall into the output) is left to the stream;
// the proxy synchronizes the stream at the end of every batch, before the user's stream is
// released.
//
// One internal stream, not one for copies and one for reductions: the operations a step
// queues together depend on each other (a reduction into a slot, then the copy of that slot
// into the output), the collectives of a batch run one after another and may read an
// earlier one's output, and both orders come free from a single in-order stream, where two
// streams would need a cross-stream wait per step. The sends and receives that run
// concurrently (runExchanges) only copy, which a second copy stream would not speed up.
#pragma once

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "coll/comm.h"
#include "coll/device/device_collectives.h"
#include "coll/task.h"
#include "core/status.h"
#include "device/runtime.h"
#include "reduce/reduce.h"
#include "reduce/stream_copy.h"

namespace ridge {

class DeviceDataOps;

// co_await: the device has run every operation queued before it on the data ops' stream.
// Ready at once on the host (no data ops) and when nothing was queued (sequence 0).
struct DataSettled : WaitCondition {
  DeviceDataOps* ops = nullptr;
  uint64_t seq = 0;  // the settle's number (DeviceDataOps::settle): ready once that one is done
  Status status;
  DataSettled();
  bool await_ready() { return !ops || !status.isOk() || ready(this); }
  void await_suspend(std::coroutine_handle<Task::promise_type> h) { h.promise().strand->blocked = this; }
  Status await_resume() { return std::move(status); }
};

class DeviceDataOps {
 public:
  // Markers recorded by settles, in a ring. Each recorded settle gets the next sequence
  // number; a marker is recorded again only once the settle it carried is done (a waiter
  // reads the done sequence, never the marker), so no waiter is moved behind later,
  // unrelated work by another strand's settle. Only when all of them still wait does a new
  // settle record the newest again (its waiters then wait for the later point: longer,
  // never too short, and the stream runs only Ridge's own copies and reductions, so it
  // always gets there).
  static constexpr size_t kMarkers = 8;

  DeviceDataOps(device::DeviceRuntime* rt, ridgeStream_t stream) : rt_(rt), stream_(stream) {}
  ~DeviceDataOps() {
    for (device::Marker* m : markers_)
      if (m) rt_->destroyMarker(m);
  }
  DeviceDataOps(const DeviceDataOps&) = delete;
  DeviceDataOps& operator=(const DeviceDataOps&) = delete;
  // Creates the marker pool (setup time, never per chunk).
  Status createMarkers() {
    for (device::Marker*& m : markers_)
      if (!m) RIDGE_TRY(rt_->createMarker(&m));
    return Status::ok();
  }

  Status copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return Status::ok();
    ++queued_;
    return rt_->copy(dst, src, bytes, stream_);
  }
  // dst = a (op) b, then / divisor when divisor > 0 (as reduce2).
  Status reduce2(void* dst, const void* a, const void* b, size_t count, ridgeDataType_t type, ridgeRedOp_t op,
                 int divisor) {
    if (count == 0) return Status::ok();
    const void* srcs[2] = {a, b};
    ++queued_;
    return rt_->launchReduce(dst, srcs, 2, count, type, op, divisor, stream_);
  }
  // Device code of a transport (device::DeviceRuntime::launchDeviceFunction) on this stream,
  // covered by the next settle like a copy. Refused (nothing queued) where the runtime cannot.
  Status launch(device::DeviceRuntime::DeviceFunction fn, void* arg, const void* src, size_t bytes) {
    RIDGE_TRY(rt_->launchDeviceFunction(fn, arg, src, bytes, stream_));
    ++queued_;
    return Status::ok();
  }
  // A settle behind everything queued so far: a marker is recorded only when something was
  // queued since the last settle (otherwise the last settle's number is shared).
  DataSettled settle() {
    DataSettled w;
    w.ops = this;
    if (queued_ != covered_) {
      if (pending_ == kMarkers) {
        Status s = advance();  // free the markers the device has passed
        if (!s.isOk()) [[unlikely]] {
          w.status = std::move(s);
          return w;
        }
      }
      // The next free marker, or, with every one still pending, the newest again.
      const size_t i = (oldest_ + pending_ - (pending_ == kMarkers ? 1 : 0)) % kMarkers;
      Status s = rt_->recordMarker(markers_[i], stream_);
      if (!s.isOk()) [[unlikely]] {
        w.status = std::move(s);
        return w;
      }
      if (pending_ < kMarkers) ++pending_;
      markerSeq_[i] = ++recordedSeq_;
      covered_ = queued_;
    }
    w.seq = recordedSeq_;
    return w;
  }
  // Whether settle number `seq` is done: queries the pending markers oldest first (as far
  // as the device got) only while it is not known to be.
  Status settled(uint64_t seq, bool* done) {
    if (doneSeq_ < seq) RIDGE_TRY(advance());
    *done = doneSeq_ >= seq;
    return Status::ok();
  }
  // Waits for the stream (the end of a batch: outputs no settle covered are written before
  // the user's stream goes on); every settle is done then.
  Status synchronize() {
    RIDGE_TRY(rt_->synchronize(stream_));
    doneSeq_ = recordedSeq_;
    pending_ = 0;
    return Status::ok();
  }
  ridgeStream_t stream() const { return stream_; }

 private:
  // Moves doneSeq_ past every pending marker the device has passed, oldest first.
  Status advance() {
    while (pending_ > 0) {
      bool passed = false;
      RIDGE_TRY(rt_->queryMarker(markers_[oldest_], &passed));
      if (!passed) break;
      doneSeq_ = markerSeq_[oldest_];
      oldest_ = (oldest_ + 1) % kMarkers;
      --pending_;
    }
    return Status::ok();
  }

  device::DeviceRuntime* rt_;
  ridgeStream_t stream_;
  device::Marker* markers_[kMarkers] = {};
  uint64_t markerSeq_[kMarkers] = {};  // the settle number each marker was last recorded for
  size_t oldest_ = 0;                  // the ring's oldest pending marker
  size_t pending_ = 0;                 // markers recorded and not yet seen passed
  uint64_t recordedSeq_ = 0;           // settles recorded so far
  uint64_t doneSeq_ = 0;               // every settle up to this one is done
  uint64_t queued_ = 0;                // operations queued so far
  uint64_t covered_ = 0;               // of those, behind the last recorded marker
};

inline DataSettled::DataSettled() {
  onDevice = true;
  ready = [](WaitCondition* self) {
    auto* w = static_cast<DataSettled*>(self);
    bool done = false;
    Status s = w->ops->settled(w->seq, &done);
    if (!s.isOk()) [[unlikely]] {
      w->status = std::move(s);
      return true;
    }
    return done;
  };
}

// Copies payload; `streaming`: host stores that bypass the cache (the output of a large
// collective, never read back), meaningless on the device. On the device only queued: settle
// before posting or releasing a slot it touches.
inline Status dataCopy(ridgeComm* c, void* dst, const void* src, size_t bytes, bool streaming = false) {
  if (!c->device->data) [[likely]] {
    if (streaming)
      streamCopy(dst, src, bytes);
    else
      std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  return c->device->data->copy(dst, src, bytes);
}

inline Status dataReduce2(ridgeComm* c, void* dst, const void* a, const void* b, size_t count,
                          ridgeDataType_t type, ridgeRedOp_t op, int divisor) {
  if (!c->device->data) [[likely]] {
    reduce2(dst, a, b, count, type, op, divisor);
    return Status::ok();
  }
  return c->device->data->reduce2(dst, a, b, count, type, op, divisor);
}

// co_await dataSettled(c): every data op queued so far has run (host: at once).
inline DataSettled dataSettled(ridgeComm* c) {
  if (!c->device->data) [[likely]]
    return DataSettled();
  return c->device->data->settle();
}

// A slot post that must follow a settle on the device but keeps its place on the host: the
// host posts at once (the algorithm's order, unchanged), the device after the next settle of
// the same step (post()), so that the step's later copies are queued behind the one that
// fills the slot and one settle covers them all.
struct PostAfterSettle {
  SendConnector* tx = nullptr;
  uint32_t bytes = 0;
  bool last = false;
  void queue(ridgeComm* c, SendConnector* conn, uint32_t n, bool lastOfMessage) {
    if (!c->device->data) [[likely]] {
      conn->post(n, lastOfMessage);
      return;
    }
    tx = conn;
    bytes = n;
    last = lastOfMessage;
  }
  // After the settle: the post the device path held back, if any.
  void post() {
    if (tx) tx->post(bytes, last);
    tx = nullptr;
  }
};

}  // namespace ridge
