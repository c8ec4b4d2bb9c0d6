// Stream-ordered collectives on device memory, staged through pinned host memory.
//
// The API call validates, puts the operation (or a group's operations on this
// communicator, as one batch) in the communicator's ring, records a ready marker on the
// user's stream, makes that stream wait until the communicator's release word reaches the
// batch's sequence number, and returns. The proxy thread (one per communicator, started on
// the first device operation) waits for the markers, then runs the batch through P2P or
// host-staged: in chunks through a bounded pinned staging buffer (RIDGE_STAGING_BYTES, two
// pieces), copying chunk k+1 in on an internal stream while the host collective of chunk k
// runs through its own Executor, and chunk k back out while chunk k+1 runs; then it writes
// the release word. docs/gpu.md has the whole story.
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

// One operation on device (or managed) memory, arguments already validated. The kinds are
// what the API's classification found for the buffers the operation uses (Host for a buffer
// it does not use), passed on so that no later stage asks the runtime again.
struct DeviceOp {
  CollArgs args;
  ridgeStream_t stream;
  device::PointerKind sendKind = device::PointerKind::Host;
  device::PointerKind recvKind = device::PointerKind::Host;
};

// RIDGE_STAGING_BYTES: pinned host memory per communicator for host-staged device
// collectives, in [kMinStagingBytes, kMaxStagingBytes]. Every rank of a communicator uses the
// smallest value among them (exchanged at init), since all must cut batches into the same
// chunks.
constexpr size_t kMinStagingBytes = size_t(64) << 10;
constexpr size_t kMaxStagingBytes = size_t(1) << 30;
// This process's RIDGE_STAGING_BYTES; an error naming the variable when it is not a size in
// range (garbage is an error here, not the default).
Status readStagingBytes(size_t* out);

// Most operations one batch (a group on one communicator) may hold; the ring holds this many.
constexpr size_t kMaxDeviceBatchOps = 256;

// One rank on device memory: every collective's result is its input (a sum, product, max,
// min or average over one rank is the value itself, bit for bit; a gather, scatter or
// all-to-all of one block is that block), so the call is one device-to-device copy of the
// output's bytes on the caller's stream, or nothing in place: no proxy, no host staging, no
// kernel. oneRankDeviceCopyTakes: whether `op` of `comm` goes that way (one rank, not a send
// or receive, and the short-cut not turned off for a test); runOneRankDeviceCopy queues it.
bool oneRankDeviceCopyTakes(const ridgeComm* comm, const DeviceOp& op);
Status runOneRankDeviceCopy(ridgeComm* comm, device::DeviceRuntime* rt, const DeviceOp& op);
// Tests of the proxy's own machinery (ring, staging, abort) with a single rank turn the
// short-cut off, so that their one-rank calls still go through the proxy. Default on.
void setOneRankDeviceCopyForTesting(bool on);

// Enqueues `n` operations of `comm` as one batch (starting the proxy on first use) and
// returns without waiting for them. Waits, bounded by the communicator's timeout and by
// ridgeCommAbort, while the ring is full. Refuses (nothing queued) a batch that the staging
// bound cannot hold even one element of per chunk.
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
