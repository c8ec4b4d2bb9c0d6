#include "topo/nvml_loader.h"

#include <dlfcn.h>

#include <cstring>

#include "topo/graph_build.h"

namespace ridge::topo {

namespace {

// The few NVML declarations we use, written from NVML's documented C API (nvml.h is not
// needed at build time). Struct layouts are those of the versioned entry points named.
using NvmlReturn = int;  // nvmlReturn_t: 0 success
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;

struct NvmlPciInfo {  // nvmlPciInfo_t as filled by the _v3 / _v2 calls below
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];  // "00000000:3B:00.0"
};

// nvmlIntNvLinkDeviceType_t
constexpr int kNvLinkRemoteGpu = 0, kNvLinkRemoteIbmNpu = 1, kNvLinkRemoteSwitch = 2;

// NVML_NVLINK_MAX_LINKS is 18 today; ask a few more and stop at the first link NVML
// refuses, so a later GPU with more links still reads.
constexpr unsigned kMaxNvLinksAsked = 32;

struct Nvml {
  void* lib = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*getCount)(unsigned*) = nullptr;
  NvmlReturn (*getHandle)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*getPci)(NvmlDevice, NvmlPciInfo*) = nullptr;
  NvmlReturn (*getName)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*getCc)(NvmlDevice, int*, int*) = nullptr;
  NvmlReturn (*linkState)(NvmlDevice, unsigned, int*) = nullptr;
  NvmlReturn (*remotePci)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
  NvmlReturn (*remoteType)(NvmlDevice, unsigned, int*) = nullptr;  // optional (driver >= 460)

  template <typename F>
  bool sym(F* f, const char* name) {
    *f = reinterpret_cast<F>(dlsym(lib, name));
    return *f != nullptr;
  }
  ~Nvml() {
    if (lib) dlclose(lib);
  }
};

std::string busIdOf(const NvmlPciInfo& p) {
  std::string raw(p.busId, strnlen(p.busId, sizeof p.busId)), out;
  if (raw.empty()) raw.assign(p.busIdLegacy, strnlen(p.busIdLegacy, sizeof p.busIdLegacy));
  return normalizeBusId(raw, &out) ? out : std::string();
}

}  // namespace

bool readNvmlGpus(std::vector<NvmlGpu>* gpus, std::string* why) {
  gpus->clear();
  Nvml n;
  n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n.lib) {
    *why = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
    return false;
  }
  if (!n.sym(&n.init, "nvmlInit_v2") || !n.sym(&n.shutdown, "nvmlShutdown") ||
      !n.sym(&n.getCount, "nvmlDeviceGetCount_v2") || !n.sym(&n.getHandle, "nvmlDeviceGetHandleByIndex_v2") ||
      !n.sym(&n.getPci, "nvmlDeviceGetPciInfo_v3") || !n.sym(&n.linkState, "nvmlDeviceGetNvLinkState") ||
      !n.sym(&n.remotePci, "nvmlDeviceGetNvLinkRemotePciInfo_v2")) {
    *why = "libnvidia-ml.so.1 lacks the NVLink queries (driver too old)";
    return false;
  }
  n.sym(&n.getName, "nvmlDeviceGetName");
  n.sym(&n.getCc, "nvmlDeviceGetCudaComputeCapability");
  n.sym(&n.remoteType, "nvmlDeviceGetNvLinkRemoteDeviceType");
  if (n.init() != kNvmlSuccess) {
    *why = "nvmlInit failed (driver not loaded?)";
    return false;
  }
  unsigned count = 0;
  if (n.getCount(&count) != kNvmlSuccess || count == 0) {
    n.shutdown();
    *why = "NVML sees no GPU";
    return false;
  }
  for (unsigned i = 0; i < count && i < 1024; ++i) {
    NvmlDevice dev = nullptr;
    NvmlPciInfo pci{};
    if (n.getHandle(i, &dev) != kNvmlSuccess || n.getPci(dev, &pci) != kNvmlSuccess) continue;
    NvmlGpu g;
    g.busId = busIdOf(pci);
    if (g.busId.empty()) continue;
    char name[96] = {};
    if (n.getName && n.getName(dev, name, sizeof name - 1) == kNvmlSuccess) g.name = name;
    int major = 0, minor = 0;
    if (n.getCc && n.getCc(dev, &major, &minor) == kNvmlSuccess) g.smVersion = major * 10 + minor;
    for (unsigned l = 0; l < kMaxNvLinksAsked; ++l) {
      int active = 0;
      const NvmlReturn r = n.linkState(dev, l, &active);
      if (r != kNvmlSuccess) break;  // past the last link, or NVLink not supported
      if (!active) continue;
      NvmlLink link;
      link.link = static_cast<int>(l);
      NvmlPciInfo remote{};
      if (n.remotePci(dev, l, &remote) == kNvmlSuccess) link.remoteBusId = busIdOf(remote);
      int type = -1;
      if (n.remoteType && n.remoteType(dev, l, &type) == kNvmlSuccess) {
        link.remote = type == kNvLinkRemoteGpu      ? NvmlRemote::Gpu
                      : type == kNvLinkRemoteSwitch ? NvmlRemote::Switch
                      : type == kNvLinkRemoteIbmNpu ? NvmlRemote::Cpu
                                                    : NvmlRemote::Unknown;
      }
      g.activeLinks.push_back(link);
    }
    gpus->push_back(std::move(g));
  }
  n.shutdown();
  if (gpus->empty()) *why = "NVML sees no GPU it can query";
  return !gpus->empty();
}

}  // namespace ridge::topo
