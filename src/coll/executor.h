// Runs collective tasks to completion on the calling thread: resumes every strand whose
// wait condition holds, and when none does, backs off from spinning to yielding to
// sleeping on the transport's futex, checking abort, peer health and RIDGE_TIMEOUT on
// the way. The only place where a rank waits.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "coll/task.h"

struct ridgeComm;

namespace ridge {

class Executor {
 public:
  // The executor of this thread, reset and ready for a new batch. Reused across calls
  // so that its arrays keep their capacity (no allocation per call in steady state).
  static Executor& forThisThread();

  // Adds a strand running `task` for `comm`. May be called by a running task.
  void spawn(ridgeComm* comm, Task task);
  // Runs until every strand finished (returns OK) or one failed, the communicator was
  // aborted, a peer died, or no strand progressed for the timeout (returns the error
  // and destroys the unfinished tasks).
  Status run();

 private:
  struct Entry {
    Strand strand;
    Task task;
    ridgeComm* comm = nullptr;
  };
  bool anyReady();
  // Backs off one step (yield or futex sleep) and checks abort, timeout and peer health.
  Status checkIdle(int64_t idleNs);
  void reset();

  std::vector<std::unique_ptr<Entry>> entries_;
  size_t used_ = 0;
  std::vector<ridgeComm*> comms_;
};

}  // namespace ridge

namespace ridge {
// co_await SpawnTask{comm, task}: starts `task` as a new strand of the running executor
// and continues at once.
struct SpawnTask {
  ridgeComm* comm;
  Task task;
  bool await_ready() const noexcept { return false; }
  bool await_suspend(std::coroutine_handle<Task::promise_type> h) {
    h.promise().strand->executor->spawn(comm, std::move(task));
    return false;
  }
  void await_resume() const noexcept {}
};
}  // namespace ridge
