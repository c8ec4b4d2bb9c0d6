// The PCIe model's view of one GPU-NIC pair, for the gdr transport: which mode the GDR
// advisor picks (RIDGE_GDR_MODE=auto) and, with RIDGE_SOFTNIC_PCIE_MODEL, how long each send
// must be held so that the emulated data path runs at the latency and throughput the model
// gives its mode ("modeled" numbers, never measured ones).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "topo/gdr_advisor.h"
#include "topo/model.h"

namespace ridge::gdr {

enum class Mode : uint8_t { Read, Write, Staged };
inline constexpr int kModeCount = 3;
// "gdr-read", "gdr-write", "host-staged".
const char* modeName(Mode m);
// A forced RIDGE_GDR_MODE value (topo::parseGdrModeSetting: "read"/"write"/"staged", the
// long names, any case); false for anything else, off and auto included.
bool parseMode(const std::string& text, Mode* out);
topo::GdrOption toGdrOption(Mode m);
Mode fromGdrOption(topo::GdrOption o);

// The advisor's placement for GPU `gpuNode` and NIC `nicNode` of a finalized topology: the
// GPU->NIC route, GPU->host memory on the NIC's NUMA node, NIC->that memory.
topo::GdrPlacement placementFromTopology(const topo::Topology& t, int gpuNode, int nicNode);

// Latency and throughput one mode is held to.
struct ModeTiming {
  double latencyNs = 0;     // first small size of the placement (8 B)
  double bandwidthGBs = 0;  // steady rate of the mode's slowest stage or limit
};

struct ModelView {
  std::string source;  // "preset cross-rc", or the file
  topo::GdrAdvice advice;
  ModeTiming timing[kModeCount];
  std::string describe() const;  // the advisor's table and reason
};

// Loads `spec` (a preset name or a topology file), picks the pair named by `pair` ("GPU0,NIC0",
// "" = first of each) and runs the advisor with default constants.
Status loadModel(const std::string& spec, const std::string& pair, ModelView* out);

// Paces sends of one connector: a send of `bytes` occupies the mode's slowest stage for
// bytes / bandwidth after the previous one, and its doorbell may ring `latency` after that.
class Pacer {
 public:
  void configure(const ModeTiming& t) {
    timing_ = t;
    enabled_ = t.bandwidthGBs > 0;
  }
  bool enabled() const { return enabled_; }
  // When the doorbell of a send of `bytes` posted at `nowNs` may ring.
  int64_t dueNs(int64_t nowNs, uint64_t bytes) {
    const double start =
        busyUntilNs_ > static_cast<double>(nowNs) ? busyUntilNs_ : static_cast<double>(nowNs);
    busyUntilNs_ = start + static_cast<double>(bytes) / timing_.bandwidthGBs;
    return static_cast<int64_t>(busyUntilNs_ + timing_.latencyNs);
  }

 private:
  ModeTiming timing_;
  bool enabled_ = false;
  double busyUntilNs_ = 0;
};

}  // namespace ridge::gdr
