#include "coll/device/device_collectives.h"

#include "coll/comm.h"
#include "core/log.h"
#include "core/settings.h"
#include "device/runtime.h"
#include "transports/net/device_memory.h"
#include "transports/net/net_transport.h"

namespace ridge {

DeviceCollectives::DeviceCollectives() = default;
DeviceCollectives::~DeviceCollectives() = default;

void DeviceCollectivesDeleter::operator()(DeviceCollectives* d) const {
  delete d;
}

DeviceCollectives* newDeviceCollectives() {
  return new DeviceCollectives();
}

bool deviceNetworkPossibleHere(ridgeComm* c) {
  device::DeviceRuntime* rt = device::activeRuntime();
  if (c->cudaDevice < 0 || !rt || c->nranks < 2 || netProvider().empty() || gdrModeOn()) return false;
  const std::string mode = settingString(Setting::GDR_DATA_PATH);
  if (mode == "off") return false;
  if (mode != "auto") {
    RIDGE_WARN("RIDGE_GDR_DATA_PATH=%s: expected auto or off; using off", mode.c_str());
    return false;
  }
  std::string why;
  Status bound = rt->bindThread(c->cudaDevice);
  if (!bound.isOk()) why = bound.message();
  if (!bound.isOk() || !RuntimeDeviceMemory::dmaBufWorks(rt, &why)) {
    RIDGE_INFO("comm %s: no GPUDirect RDMA data path: device memory cannot be exported as dma-buf (%s)",
               c->name.c_str(), why.c_str());
    return false;
  }
  return true;
}

// Builds the device network when every rank can and every pair of ranks is the net
// transport's: the same decision on every rank, from the all-gathered PeerInfo, since
// creating the transport is collective.
static Status setupDeviceNetwork(ridgeComm* c, const TransportSetup& setup) {
  bool all = c->nranks > 1;
  for (const PeerInfo& p : c->peers) all = all && p.deviceNetReady;
  for (int a = 0; a < c->nranks && all; ++a)
    for (int b = a + 1; b < c->nranks && all; ++b) all = netPairReachable(setup, a, b) && !gdrModeOn();
  if (!all) return Status::ok();
  DeviceCollectives& d = *c->device;
  d.netSlotMemory = std::make_unique<RuntimeDeviceMemory>(device::activeRuntime(), c->cudaDevice);
  TransportSetup deviceSetup = setup;
  deviceSetup.netRingAllocator = d.netSlotMemory.get();
  RIDGE_TRY(createNetTransport(deviceSetup, &d.net));
  d.netSendTo.assign(c->nranks, nullptr);
  d.netRecvFrom.assign(c->nranks, nullptr);
  for (int peer = 0; peer < c->nranks; ++peer) {
    if (peer == c->rank) continue;
    d.netSendTo[peer] = d.net->sendTo(peer);
    d.netRecvFrom[peer] = d.net->recvFrom(peer);
    if (!d.netSendTo[peer] || !d.netRecvFrom[peer])
      return makeError(ridgeInternalError, "rank %d: the device network has no connector to rank %d", c->rank,
                       peer);
  }
  RIDGE_INFO(
      "comm %s: device network up (%s, slots in device %d memory): device collectives between hosts "
      "move NIC <-> GPU memory",
      c->name.c_str(), d.net->name(), c->cudaDevice);
  return Status::ok();
}

Status setupDeviceCollectives(ridgeComm* c, const TransportSetup& setup) {
  RIDGE_TRY(setupDeviceNetwork(c, setup));
  return setupLL(c);
}

void releaseDeviceCollectives(ridgeComm* c) {
  stopGpuProxy(c, c->aborted.load());
  // Waits for this rank's last LL launch (an abort stops them) before its area and mappings go.
  releaseLL(c);
  // The device network's slots are freed through the allocator, so the transport goes before
  // them.
  DeviceCollectives& d = *c->device;
  d.netSendTo.clear();
  d.netRecvFrom.clear();
  d.net.reset();
  d.netSlotMemory.reset();
}

}  // namespace ridge
