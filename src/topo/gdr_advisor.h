// GDR advisor: for one GPU-NIC pair, which of the three ways to move a GPU's data to the
// NIC a send should use, with the model's numbers behind the choice.
//
//   gdr-read     the NIC reads GPU memory (classic GPUDirect RDMA): non-posted reads along
//                the NIC->GPU route, no copy. Right when both sit under one PCIe switch.
//   gdr-write    the GPU writes the data (posted writes) into staging memory next to the NIC
//                (on-NIC memory, else pinned host memory on the NIC's NUMA node) and rings the
//                NIC's doorbell; the NIC then reads the staged data locally. Crosses the long
//                path once with writes instead of twice with reads.
//   host-staged  a copy engine writes to pinned host memory, a CPU proxy posts the send, the
//                NIC reads host memory. Always possible; slowest to start.
//
// Each option is a chain of stages (transfers estimated by the PCIe model and fixed costs).
// A small message goes through the stages one after the other; a large one is pipelined in
// chunks, so it runs at the slowest stage's rate. The choice compares the model's numbers:
// highest large-message bandwidth first, then lowest small-message latency; the placement
// class (PIX ... SYS) only breaks a tie and words the reason. docs/topology.md has the rules
// and a worked table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "topo/pcie_model.h"

namespace ridge::topo {

enum class GdrOption : uint8_t { GdrRead, GdrWrite, HostStaged };
inline constexpr int kGdrOptionCount = 3;

/// "gdr-read", "gdr-write", "host-staged".
const char* gdrOptionName(GdrOption o);

/// RIDGE_GDR_MODE as every reader takes it (the planner, the gdr and net transports): one
/// parser, so that a value one of them accepts the others accept too.
struct GdrModeSetting {
  enum class Kind : uint8_t { Off, Auto, Forced };
  Kind kind = Kind::Off;
  GdrOption forced = GdrOption::HostStaged;  ///< Kind::Forced only
};

/// Case-insensitive: empty or "off" (the RDMA transport as is), "auto" (the advisor
/// decides), "read"/"gdr-read", "write"/"gdr-write", "staged"/"host-staged" (forced).
/// False for anything else (`out` untouched).
bool parseGdrModeSetting(const std::string& text, GdrModeSetting* out);

/// RIDGE_GDR_MODE read and parsed as above; ridgeInvalidArgument naming the accepted values
/// for anything else. The one reader of the setting for planner and transports.
Status readGdrModeSetting(GdrModeSetting* out);

/// Where the GPU-NIC route goes, in nvidia-smi's words (NODE: through several host bridges of
/// one NUMA node; SYS: across the socket link).
enum class PlacementClass : uint8_t { Unknown, PIX, PXB, PHB, NODE, SYS };

const char* placementClassName(PlacementClass c);

/// Class of a GPU->NIC route from its hops: a socket link makes SYS, two or more root
/// complexes NODE, one PHB, more than one switch PXB, else PIX.
PlacementClass classifyRoute(const Route& gpuToNic);

/// One GPU-NIC pair and what its platform allows.
struct GdrPlacement {
  std::string gpu = "GPU";  ///< names for the reason and the table
  std::string nic = "NIC";
  PlacementClass pathClass = PlacementClass::Unknown;  ///< Unknown: classifyRoute(gpuToNic)
  /// GPU (requester) to the NIC (completer NicMemory). GDR-write's GPU writes and doorbells go
  /// along it; GDR-read's NIC reads go along its reverse (mps/mrrs/tags set here apply).
  Route gpuToNic;
  /// GPU to pinned host memory on the NIC's NUMA node (completer HostMemory).
  Route gpuToHostMemory;
  /// NIC to that host memory (completer HostMemory).
  Route nicToHostMemory;
  bool nicReadsGpuMemory = true;    ///< dma-buf or peer-memory registration works: gdr-read possible
  bool gpuRingsNicDoorbell = true;  ///< the NIC's doorbell page maps into the GPU: gdr-write possible
  bool nicStagingMemory = false;    ///< NIC memory maps into the GPU: gdr-write stages there
  bool hostStaging = true;          ///< pinned host memory and a proxy thread are available
  /// The NIC has an RDMA (verbs) device (nicHasRdma). Without one no option applies: its
  /// traffic goes over TCP from host memory, which is not the advisor's question.
  bool nicRdma = true;
  double nicPortGBs = 0;            ///< network rate of the port (400G = 50); caps all; 0 unknown
  std::vector<uint64_t> smallSizes = {8, 4096};  ///< latency sizes; the first one decides
  uint64_t largeSize = uint64_t{64} << 20;       ///< bandwidth size
};

enum class StagingTier : uint8_t { None, NicMemory, HostMemory };
const char* stagingTierName(StagingTier t);

/// One step of an option, timed for the first small size and for one pipeline chunk.
struct GdrStage {
  std::string name;         ///< "GPU writes NIC memory", "CPU proxy posts the send", ...
  double smallNs = 0;       ///< time for smallSizes[0] (or its fixed cost)
  double bandwidthGBs = 0;  ///< data stages: steady rate; 0 for fixed costs and doorbells
  std::string limitedBy;    ///< what limits that rate
};

struct GdrOptionEstimate {
  GdrOption option = GdrOption::GdrRead;
  bool possible = false;
  std::string whyNot;  ///< when !possible
  StagingTier staging = StagingTier::None;
  std::vector<double> latencyNs;  ///< one per GdrPlacement::smallSizes
  double largeBandwidthGBs = 0;   ///< largeSize / time(largeSize)
  double steadyBandwidthGBs = 0;  ///< rate of the slowest stage (or other limit)
  std::string limitedBy;          ///< "NIC reads GPU memory: root-complex P2P read forwarding"
  std::vector<GdrStage> stages;
  /// gdr-write with NIC memory: the staging tier not taken, with its numbers, "" otherwise.
  std::string otherTier;
};

struct GdrAdvice {
  std::string gpu, nic;
  PlacementClass pathClass = PlacementClass::Unknown;
  std::vector<uint64_t> smallSizes;
  uint64_t largeSize = 0;
  GdrOptionEstimate options[kGdrOptionCount];  ///< indexed by GdrOption, impossible ones too
  GdrOption chosen = GdrOption::HostStaged;
  /// "bandwidth", "latency", "class rule", "only option" or "nothing possible".
  std::string decidedBy;
  std::string reason;  ///< one line for people
  const GdrOptionEstimate& estimate(GdrOption o) const { return options[static_cast<int>(o)]; }
};

/// Estimates every option for `placement` and chooses one.
GdrAdvice adviseGdr(const GdrPlacement& placement, const PcieConstants& constants);

/// Table for `ridge-topo gdr`: a header row, then one row per option (option, possible,
/// staging, latency per small size in us, bandwidth at the large size in GB/s, limited by,
/// "chosen" mark).
std::vector<std::vector<std::string>> gdrAdviceRows(const GdrAdvice& advice);

/// The rows aligned in columns, then "GPU0 -> NIC1 (PHB): gdr-write: <reason>".
std::string gdrAdviceText(const GdrAdvice& advice);

/// One JSON object with everything in GdrAdvice (infinite rates are written as null).
std::string gdrAdviceJson(const GdrAdvice& advice);

/// "8 B", "4 KiB", "64 MiB" (1024-based, whole units only; else bytes).
std::string sizeLabel(uint64_t bytes);

}  // namespace ridge::topo
