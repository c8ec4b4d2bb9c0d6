#include "device/runtime.h"

#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>

#include "core/log.h"
#include "core/settings.h"
#include "device/emulated_runtime.h"
#include "topo/load.h"

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

namespace {
// Kernel twins: a handful at most (one per transport device function); written once at set-up.
constexpr int kMaxKernelTwins = 8;
std::atomic<DeviceRuntime::DeviceFunction> gTwinFns[kMaxKernelTwins];
std::atomic<DeviceRuntime::KernelTwin> gTwins[kMaxKernelTwins];
std::mutex gTwinMutex;
}  // namespace

void DeviceRuntime::registerKernelTwin(DeviceFunction fn, KernelTwin twin) {
  std::lock_guard<std::mutex> lock(gTwinMutex);
  for (int i = 0; i < kMaxKernelTwins; ++i) {
    const DeviceFunction have = gTwinFns[i].load(std::memory_order_relaxed);
    if (have == fn) return;
    if (have == nullptr) {
      gTwins[i].store(twin, std::memory_order_relaxed);
      gTwinFns[i].store(fn, std::memory_order_release);  // published after its twin
      return;
    }
  }
  RIDGE_WARN("device runtime: more than %d kernel twins; this one is not registered", kMaxKernelTwins);
}

DeviceRuntime::KernelTwin DeviceRuntime::kernelTwin(DeviceFunction fn) {
  for (int i = 0; i < kMaxKernelTwins; ++i) {
    const DeviceFunction have = gTwinFns[i].load(std::memory_order_acquire);
    if (have == nullptr) return nullptr;
    if (have == fn) return gTwins[i].load(std::memory_order_relaxed);
  }
  return nullptr;
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

// RIDGE_DEVICE=emulated: this process's emulated runtime. Per process, not per program: a
// forked child (ridge-bench -np forks its ranks) does not have the worker threads of a
// runtime its parent made, so it makes its own; the parent's copy is left alone (never
// destroyed: its threads do not exist here).
std::mutex gEmulatedMutex;
EmulatedRuntime* gEmulated = nullptr;
pid_t gEmulatedPid = 0;

// Without a topology file the emulated devices have no bus ids: communicators then keep
// the host plan (docs/planner.md).
constexpr int kEmulatedDevicesWithoutFile = 8;

EmulatedRuntime* emulatedRuntimeOfThisProcess() {
  std::lock_guard<std::mutex> lock(gEmulatedMutex);
  if (gEmulated && gEmulatedPid == getpid()) return gEmulated;
  std::vector<std::string> busIds;
  const std::string file = settingString(Setting::TOPO_FILE);
  if (!file.empty()) {
    topo::Topology t;
    Status s = topo::loadTopologyFile(file, &t);
    if (s.isOk()) {
      for (int g : t.gpus()) busIds.push_back(t.node(g).busId);
    } else {
      RIDGE_WARN("RIDGE_DEVICE=emulated: RIDGE_TOPO_FILE: %s; %d emulated devices without bus ids",
                 s.message().c_str(), kEmulatedDevicesWithoutFile);
    }
  }
  const int devices = busIds.empty() ? kEmulatedDevicesWithoutFile : static_cast<int>(busIds.size());
  gEmulated = new EmulatedRuntime(devices);
  gEmulated->setPciBusIds(busIds);
  gEmulated->setIpcAcrossProcesses(true);
  gEmulatedPid = getpid();
  RIDGE_INFO(
      "RIDGE_DEVICE=emulated: %d emulated devices%s (a testing aid: device memory and streams on host "
      "threads)",
      devices, busIds.empty() ? "" : (" placed as " + file + " says").c_str());
  return gEmulated;
}
}  // namespace

// Asked by activeRuntime (API calls without a communicator, and communicator init; an
// operation uses its communicator's answer, runtimeOf): one environment lookup and no
// allocation. deviceSettingValue's strings cost 0.3-0.4 us a call under
// mpirun's environment, a tenth of a 64 KiB broadcast (issue 21).
bool emulatedBySettings() {
  static const std::string name = std::string("RIDGE_") + settingInfo(Setting::DEVICE).name;
  const char* v = std::getenv(name.c_str());
  return v && strcasecmp(v, "emulated") == 0;
}

std::string deviceSettingValue() {
  std::string v = settingString(Setting::DEVICE);
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return v.empty() ? "auto" : v;
}

Status checkDeviceSetting() {
  const std::string v = deviceSettingValue();
  if (v == "auto" || v == "emulated") return Status::ok();
  return makeError(ridgeInvalidArgument, "RIDGE_DEVICE=%s: expected auto or emulated (any case)",
                   settingString(Setting::DEVICE).c_str());
}

DeviceRuntime* activeRuntime() {
  return runtimeOf(emulatedBySettings());
}

DeviceRuntime* runtimeOf(bool emulatedAtInit) {
  if (DeviceRuntime* rt = gTestRuntime.load(std::memory_order_acquire)) return rt;
  if (emulatedAtInit) return emulatedRuntimeOfThisProcess();
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
