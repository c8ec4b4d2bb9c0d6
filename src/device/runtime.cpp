#include "device/runtime.h"

#include <atomic>

namespace ridge::device {

const char* pointerKindName(PointerKind kind) {
  switch (kind) {
    case PointerKind::Host: return "host";
    case PointerKind::Device: return "device";
    case PointerKind::Managed: return "managed";
  }
  return "?";
}

const char* peerLinkKindName(int kind) {
  switch (static_cast<DeviceRuntime::PeerLinkKind>(kind)) {
    case DeviceRuntime::PeerLinkKind::SameDevice: return "same-device";
    case DeviceRuntime::PeerLinkKind::NvLink: return "nvlink";
    case DeviceRuntime::PeerLinkKind::Pcie: return "pcie";
    case DeviceRuntime::PeerLinkKind::Unknown: return "p2p";
  }
  return "?";
}

DeviceRuntime::~DeviceRuntime() = default;

Status DeviceRuntime::mapHostRange(void* addr, size_t bytes, HostRangeKind kind, uint64_t* deviceAddress) {
  return makeError(ridgeInvalidUsage, "the %s device runtime cannot map %s into a device", name(),
                   kind == HostRangeKind::IoMemory ? "I/O memory" : "host memory");
}

Status DeviceRuntime::unmapHostRange(void* addr) {
  return makeError(ridgeInvalidUsage, "the %s device runtime maps no host ranges", name());
}

Status DeviceRuntime::takeReleaseWord(ReleaseWord* out) {
  std::lock_guard<std::mutex> lock(wordMutex_);
  if (freeWords_.empty()) {
    // One page of words at a time: a communicator needs one, and words are recycled.
    constexpr size_t kPage = 4096;
    void* host = nullptr;
    uint64_t dev = 0;
    RIDGE_TRY(allocWordPage(kPage, &host, &dev));
    const size_t n = kPage / sizeof(uint32_t);
    for (size_t i = n; i-- > 0;)
      freeWords_.push_back({static_cast<volatile uint32_t*>(host) + i, dev + i * sizeof(uint32_t)});
  }
  *out = freeWords_.back();
  freeWords_.pop_back();
  return Status::ok();
}

void DeviceRuntime::returnReleaseWord(const ReleaseWord& w) {
  std::lock_guard<std::mutex> lock(wordMutex_);
  freeWords_.push_back(w);
}

namespace {
std::atomic<DeviceRuntime*> gTestRuntime{nullptr};
}

DeviceRuntime* activeRuntime() {
  if (DeviceRuntime* rt = gTestRuntime.load(std::memory_order_acquire)) return rt;
#ifdef RIDGE_HAVE_CUDA
  return cudaRuntime();
#else
  return nullptr;
#endif
}

ScopedRuntimeForTesting::ScopedRuntimeForTesting(DeviceRuntime* rt) : previous_(gTestRuntime.exchange(rt)) {}

ScopedRuntimeForTesting::~ScopedRuntimeForTesting() {
  gTestRuntime.store(previous_);
}

}  // namespace ridge::device
