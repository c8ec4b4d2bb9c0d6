// Stream-ordered collectives on device memory, staged through pinned host memory.
//
// The API call validates, puts the operation (or a group's operations on this
// communicator, as one batch) in the communicator's ring, records a ready marker on the
// user's stream, makes that stream wait until the communicator's release word reaches the
// batch's sequence number, and returns. The proxy thread (one per communicator, started on
// the first device operation) waits for the markers, copies the device inputs to pinned
// host memory on an internal stream, runs the host collectives through its own Executor,
// copies the results back and writes the release word. docs/gpu.md has the whole story.
#pragma once

#include <cstddef>

#include "coll/algorithms.h"
#include "core/status.h"
#include "device/runtime.h"

struct ridgeComm;

namespace ridge {

class GpuProxy;
struct GpuProxyDeleter {
  void operator()(GpuProxy* p) const;
};

// One operation on device (or managed) memory, arguments already validated.
struct DeviceOp {
  CollArgs args;
  ridgeStream_t stream;
};

// Most operations one batch (a group on one communicator) may hold; the ring holds this many.
constexpr size_t kMaxDeviceBatchOps = 256;

// Enqueues `n` operations of `comm` as one batch (starting the proxy on first use) and
// returns without waiting for them. Waits, bounded by the communicator's timeout and by
// ridgeCommAbort, while the ring is full, and when the staging buffer must grow for this
// batch: it grows on the calling thread, only once every earlier batch has been released.
Status submitDeviceBatch(ridgeComm* comm, device::DeviceRuntime* rt, const DeviceOp* ops, size_t n);

// Waits until the proxy has finished every queued batch (no-op without a proxy). Host-memory
// collectives call it first, so they never run on the connectors concurrently with the proxy.
Status drainDeviceOps(ridgeComm* comm);

// Stops the proxy (no-op without one). abort == false: as finishGpuProxy, its status
// dropped (a batch it could not run is still the communicator's asynchronous error).
// abort == true: releases every issued sequence number first, then joins the proxy thread,
// so no user stream waits forever even when the proxy is stuck inside a runtime call.
void stopGpuProxy(ridgeComm* comm, bool abort);

// Lets the queued batches finish (bounded by the timeout), then stops the proxy. Not ok when
// they did not all finish: the batches left were released without running, and each set the
// communicator's asynchronous error and last error text (finalize reports it).
Status finishGpuProxy(ridgeComm* comm);

}  // namespace ridge
