// Tests only: a hook the TCP transport's send lane calls at the start of every pass, after every piece it
// writes and after every write call, so that a test can stretch the windows in which the lane has handed a
// chunk to the kernel but not yet told the algorithm (tests/socket/socket_race_test.cpp), or has not yet
// written a chunk the algorithm posted, and count how many calls its pieces took. Nothing in Ridge sets it;
// one relaxed load per piece and per write call.
// While a hook is installed, the algorithm thread does not write queued pieces itself when it waits for its
// sends (socket_transport.cpp, pumpSendsInline), so that every piece goes through the stretched lane, unless
// the hook was installed with inlineSends (a test of that very path).
#pragma once

#include <atomic>

namespace ridge {

enum class SendLaneStage {
  BeforePass,  // a pass starts (peer -1): as if the lane's thread were not scheduled yet
  AfterPiece,  // a piece is written, its slot not yet handed back to the algorithm
  AfterWrite,  // a write call (which may carry several queued pieces) returned having written some bytes
};

using SendLaneHook = void (*)(SendLaneStage stage, int peer);

inline std::atomic<SendLaneHook>& sendLaneHook() {
  static std::atomic<SendLaneHook> hook{nullptr};
  return hook;
}

inline std::atomic<bool>& sendLaneHookAllowsInline() {
  static std::atomic<bool> allows{false};
  return allows;
}

// `hook` runs on the send lane's thread from now on (nullptr: none); inlineSends: the algorithm
// thread may still write queued pieces itself meanwhile (never through the hook).
inline void setSendLaneHook(SendLaneHook hook, bool inlineSends = false) {
  sendLaneHookAllowsInline().store(inlineSends);
  sendLaneHook().store(hook);
}

inline void sendLaneStage(SendLaneStage stage, int peer) {
  if (SendLaneHook h = sendLaneHook().load(std::memory_order_relaxed)) [[unlikely]]
    h(stage, peer);
}

}  // namespace ridge
