// NVML (the NVIDIA driver's management library), opened with dlopen at run time so that
// Ridge has no build or load dependency on the driver. Only what topology discovery needs:
// each GPU's bus id, compute capability and the remote end of each active NVLink.
#pragma once

#include <string>
#include <vector>

namespace ridge::topo {

/// What is at the far end of one NVLink.
enum class NvmlRemote { Gpu, Switch, Cpu, Unknown };

struct NvmlLink {
  int link = 0;             ///< link number on the GPU (0 .. 17 on H100)
  std::string remoteBusId;  ///< "0000:3b:00.0" (normalized), "" when NVML does not say
  NvmlRemote remote = NvmlRemote::Unknown;
};

struct NvmlGpu {
  std::string busId;  ///< normalized "dddd:bb:dd.f"
  std::string name;   ///< "NVIDIA H100 80GB HBM3"
  int smVersion = 0;  ///< compute capability major * 10 + minor, 0 unknown
  std::vector<NvmlLink> activeLinks;
};

/// Reads every GPU NVML sees. False with `why` set ("libnvidia-ml.so.1 not found", "no
/// GPU") when there is nothing to read; that is not an error for discovery.
bool readNvmlGpus(std::vector<NvmlGpu>* gpus, std::string* why);

}  // namespace ridge::topo
