// The device side of a communicator: everything its collectives on device (or managed) memory
// need, in one object the communicator holds (ridgeComm::device), so that the communicator
// itself keeps only what every collective reads.
//
// Four paths share it (docs/gpu.md, docs/architecture.md):
// - the LL path (ll_path.h): small collectives between the ranks of one host, one kernel on
//   the caller's stream; its state is built at init when every rank can take part;
// - the GPU proxy (gpu_proxy.h): one thread per communicator, started on the first device
//   operation the LL path does not take, which runs each batch through one of
// - the P2P engine (p2p.h): device to device through IPC handles between the ranks of one
//   host, its context created by the proxy thread's setup;
// - the device network: a second net transport with its slots in device memory (the classic
//   GPUDirect RDMA data path), built at init, whose batches the host algorithms run with the
//   data-ops seam (data_ops.h) switched to the device;
// - or, when none of those takes a batch, host staging through pinned memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "coll/device/gpu_proxy.h"
#include "coll/device/ll_path.h"
#include "coll/device/p2p.h"
#include "core/status.h"
#include "transports/transport.h"

struct ridgeComm;

namespace ridge {

class DeviceDataOps;  // coll/device/data_ops.h

struct DeviceCollectives {
  DeviceCollectives();
  ~DeviceCollectives();
  DeviceCollectives(const DeviceCollectives&) = delete;
  DeviceCollectives& operator=(const DeviceCollectives&) = delete;

  // Pinned staging bytes of the proxy: the smallest RIDGE_STAGING_BYTES of the ranks (set at
  // init), so that every rank cuts staged batches into the same chunks.
  size_t stagingBytes = 0;

  // The proxy that runs the stream-ordered collectives on device memory (gpu_proxy.h),
  // started on the first such call (under proxyMutex), stopped by finalize, destroy and abort.
  std::mutex proxyMutex;
  std::unique_ptr<GpuProxy, GpuProxyDeleter> proxy;
  // The P2P path of the proxy (p2p.h): IPC mapping cache, internal stream and counters;
  // created by the proxy thread's setup (before any stream waits on it), freed with the proxy.
  std::unique_ptr<ridge::p2p::Context, ridge::p2p::ContextDeleter> p2p;

  // The device network (classic GPUDirect RDMA data path, docs/gpu.md): a second net
  // transport whose send areas and receive rings are device memory of the communicator's
  // device, built at init when every rank can (PeerInfo::deviceNetReady) and every peer is
  // reached through the net transport; null otherwise. Its connectors serve only the proxy's
  // batches that every rank voted onto it (netBatches); host collectives keep the
  // communicator's sendTo/recvFrom.
  std::unique_ptr<NetRingAllocator> netSlotMemory;  // outlives net (declared first)
  std::unique_ptr<Transport> net;
  std::vector<SendConnector*> netSendTo;  // by rank; null for self
  std::vector<RecvConnector*> netRecvFrom;

  // Set by the proxy only while a batch runs on the device network, or while it runs a staged
  // batch's sends and receives on their device buffers: the algorithms then move and reduce
  // payload with the device runtime (data_ops.h: queued on the proxy's stream, settled per
  // step), never through the direct extension, and take the ring and chain algorithms
  // (alltoall: all-pairs). Null: host memory, memcpy and the host reductions.
  DeviceDataOps* data = nullptr;

  // The LL path (ll_path.h): areas, status word, operation counter and ordering marker; built
  // at init when every rank can take part, null otherwise. Small collectives on device memory
  // are then launched on the caller's stream, not handed to the proxy.
  std::unique_ptr<LLState, LLStateDeleter> ll;

  // Counters (proxy thread; read after the batches finished).
  uint64_t netBatches = 0;     // batches every rank voted onto the device network
  uint64_t netDeclined = 0;    // batches the vote left to staging
  uint64_t stagedBatches = 0;  // batches run host-staged (neither P2P nor the device network)
};

// Whether this rank can take part in a device network: it serves a device through an active
// runtime, RIDGE_GDR_DATA_PATH is not off, RIDGE_NET names a provider that the gdr transport
// does not take over, and the runtime exports device memory as dma-buf (checked once here, on
// the communicator's device). Init sends the answer to every rank (PeerInfo::deviceNetReady).
bool deviceNetworkPossibleHere(ridgeComm* comm);

// The device side's part of init, after the host transports are up (every rank calls it: it
// exchanges through the bootstrap and creates transports collectively): the device network
// when every rank can build it and every pair of ranks is the net transport's (`setup` is the
// host transports' setup), then the LL path.
Status setupDeviceCollectives(ridgeComm* comm, const TransportSetup& setup);

// The device side's part of destroy, before the host connectors go: the proxy (it may still
// use them, and every stream waiting on the communicator's release word must be released),
// the LL path (launches on the users' streams write into peers' areas), then the device
// network (it lets its last writes drain, so that a peer still finishing a device batch with
// this rank sees it go before the host connections).
void releaseDeviceCollectives(ridgeComm* comm);

}  // namespace ridge
