// Tests only: a hook the TCP transport's send lane calls at the start of every pass and after every piece it
// writes, so that a test can stretch the windows in which the lane has handed a chunk to the kernel but not
// yet told the algorithm (tests/socket/socket_race_test.cpp), or has not yet written a chunk the algorithm
// posted. Nothing in Ridge sets it; one relaxed load per piece.
#pragma once

#include <atomic>

namespace ridge {

enum class SendLaneStage {
  BeforePass,  // a pass starts (peer -1): as if the lane's thread were not scheduled yet
  AfterPiece,  // a piece is written, its slot not yet handed back to the algorithm
};

using SendLaneHook = void (*)(SendLaneStage stage, int peer);

inline std::atomic<SendLaneHook>& sendLaneHook() {
  static std::atomic<SendLaneHook> hook{nullptr};
  return hook;
}

// `hook` runs on the send lane's thread from now on (nullptr: none).
inline void setSendLaneHook(SendLaneHook hook) {
  sendLaneHook().store(hook);
}

inline void sendLaneStage(SendLaneStage stage, int peer) {
  if (SendLaneHook h = sendLaneHook().load(std::memory_order_relaxed)) [[unlikely]]
    h(stage, peer);
}

}  // namespace ridge
