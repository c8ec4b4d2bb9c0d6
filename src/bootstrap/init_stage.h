// Named points of communicator init where the chaos tests (tests/chaos) stop or kill a rank:
// each stage calls initStage(), which does nothing unless a test installed a hook. The hook
// runs on the initializing thread; one global pointer read per stage, never on a hot path.
#pragma once

#include <atomic>

namespace ridge {

enum class InitStage {
  BootstrapListening,      // the rank's own listener is open, the root not yet contacted
  BootstrapHelloSent,      // hello sent, waiting for the address table
  BootstrapTableReceived,  // table received, ring not yet connected
  BootstrapRingConnected,  // bootstrap done
  ShmSegmentCreated,       // the host's lowest rank created the shared segment (others not attached)
  ShmSegmentAttached,      // this rank mapped the segment, the creator may still hold it
  Count
};

inline const char* initStageName(InitStage s) {
  switch (s) {
    case InitStage::BootstrapListening: return "bootstrap-listening";
    case InitStage::BootstrapHelloSent: return "bootstrap-hello-sent";
    case InitStage::BootstrapTableReceived: return "bootstrap-table-received";
    case InitStage::BootstrapRingConnected: return "bootstrap-ring-connected";
    case InitStage::ShmSegmentCreated: return "shm-segment-created";
    case InitStage::ShmSegmentAttached: return "shm-segment-attached";
    case InitStage::Count: break;
  }
  return "?";
}

// `detail` depends on the stage: BootstrapListening passes the rank's own listening address
// (const SocketAddress*, bootstrap/socket.h) so that a test can send strangers to it; the
// other stages pass nullptr.
using InitStageHook = void (*)(InitStage, const void* detail);

inline std::atomic<InitStageHook>& initStageHook() {
  static std::atomic<InitStageHook> hook{nullptr};
  return hook;
}

// Tests only: `hook` runs at every stage from now on (nullptr: none).
inline void setInitStageHook(InitStageHook hook) {
  initStageHook().store(hook);
}

inline void initStage(InitStage s, const void* detail = nullptr) {
  if (InitStageHook h = initStageHook().load(std::memory_order_relaxed)) h(s, detail);
}

}  // namespace ridge
