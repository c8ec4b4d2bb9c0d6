// Collective algorithms are C++20 coroutines ("tasks") that suspend whenever a
// connector has no slot to give. An Executor resumes them when the slot may be there.
//
// Why coroutines: an operation inside a group must make progress together with the
// others (a send and a receive between the same two ranks, or one thread driving the
// ranks of several communicators), so no algorithm may block. Writing each algorithm as
// an explicit state machine would bury the step structure that docs/algorithms.md
// describes; a coroutine keeps the loop readable and still never blocks.
//
// A "strand" is one independently progressing chain of tasks: a root task plus the
// children it awaits. The strand records its innermost suspended coroutine (`leaf`) and
// what that coroutine waits for (`blocked`), so the executor polls without resuming.
// Coroutine frames come from a per-thread free list, so steady-state calls allocate
// nothing.
#pragma once

#include <coroutine>
#include <cstddef>
#include <utility>

#include "core/status.h"
#include "transports/transport.h"

namespace ridge {

class Executor;

// What a suspended strand waits for: a predicate polled by the executor.
struct WaitCondition {
  bool (*ready)(WaitCondition* self) = nullptr;
  int peer = -1;  // the rank whose action would make it ready (for health checks)
  // Waits for the device (coll/device/data_ops.h), which wakes no transport: the executor then
  // sleeps in short slices (nanosleep), never on a transport.
  bool onDevice = false;
};

struct Strand {
  std::coroutine_handle<> leaf;
  WaitCondition* blocked = nullptr;
  bool done = false;
  Status result;
  Executor* executor = nullptr;
};

void* allocateFrame(size_t bytes);
void freeFrame(void* p, size_t bytes) noexcept;

class [[nodiscard]] Task {
 public:
  struct promise_type {
    Status result;
    std::coroutine_handle<> continuation;
    Strand* strand = nullptr;

    Task get_return_object() { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        promise_type& p = h.promise();
        if (p.continuation) {
          p.strand->leaf = p.continuation;
          return p.continuation;
        }
        p.strand->done = true;
        p.strand->result = std::move(p.result);
        return std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    FinalAwaiter final_suspend() noexcept { return {}; }
    void return_value(Status s) { result = std::move(s); }
    void unhandled_exception() noexcept {
      result = Status(ridgeInternalError, "internal error: exception inside a collective task");
    }
    static void* operator new(size_t bytes) { return allocateFrame(bytes); }
    static void operator delete(void* p, size_t bytes) noexcept { freeFrame(p, bytes); }
  };

  Task() = default;
  explicit Task(std::coroutine_handle<promise_type> h) : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~Task() {
    if (h_) h_.destroy();
  }

  // Awaiting a child task runs it inside the parent's strand.
  bool await_ready() const noexcept { return false; }
  template <class P>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<P> parent) noexcept {
    Strand* strand = parent.promise().strand;
    h_.promise().continuation = parent;
    h_.promise().strand = strand;
    strand->leaf = h_;
    return h_;
  }
  Status await_resume() { return std::move(h_.promise().result); }

  std::coroutine_handle<promise_type> handle() const { return h_; }

 private:
  std::coroutine_handle<promise_type> h_;
};

// co_await acquireSlot(conn): a free send slot (suspends while the FIFO is full).
struct AcquireSlot : WaitCondition {
  SendConnector* conn;
  void* slot = nullptr;
  explicit AcquireSlot(SendConnector* c) : conn(c) {
    peer = c->peer();
    ready = [](WaitCondition* self) {
      auto* a = static_cast<AcquireSlot*>(self);
      a->slot = a->conn->tryAcquire();
      return a->slot != nullptr;
    };
  }
  bool await_ready() { return (slot = conn->tryAcquire()) != nullptr; }
  void await_suspend(std::coroutine_handle<Task::promise_type> h) { h.promise().strand->blocked = this; }
  void* await_resume() const { return slot; }
};

// co_await peekSlot(conn): the oldest posted slot and its metadata.
struct PeekSlot : WaitCondition {
  RecvConnector* conn;
  const void* slot = nullptr;
  SlotInfo info;
  explicit PeekSlot(RecvConnector* c) : conn(c) {
    peer = c->peer();
    ready = [](WaitCondition* self) {
      auto* a = static_cast<PeekSlot*>(self);
      a->slot = a->conn->tryPeek(&a->info);
      return a->slot != nullptr;
    };
  }
  bool await_ready() { return (slot = conn->tryPeek(&info)) != nullptr; }
  void await_suspend(std::coroutine_handle<Task::promise_type> h) { h.promise().strand->blocked = this; }
  const void* await_resume() const { return slot; }
};

// co_await PostDirect(conn, src, bytes): queues caller memory as the next chunk of a
// connector with the direct extension (suspends while the FIFO is full). Polling may post,
// so `posted` keeps a second poll from posting again.
struct PostDirect : WaitCondition {
  SendConnector* conn;
  const void* src;
  uint32_t bytes;
  bool last;
  bool posted = false;
  PostDirect(SendConnector* c, const void* s, size_t n, bool lastOfMessage = false)
      : conn(c), src(s), bytes(static_cast<uint32_t>(n)), last(lastOfMessage) {
    peer = c->peer();
    ready = [](WaitCondition* self) {
      auto* a = static_cast<PostDirect*>(self);
      return a->posted || (a->posted = a->conn->tryPostDirect(a->src, a->bytes, a->last));
    };
  }
  bool await_ready() { return ready(this); }
  void await_suspend(std::coroutine_handle<Task::promise_type> h) { h.promise().strand->blocked = this; }
  void await_resume() const {}
};

// co_await SendsComplete(conn): every chunk posted on `conn` has left this process, so the
// caller memory queued with PostDirect may be reused.
struct SendsComplete : WaitCondition {
  SendConnector* conn;
  explicit SendsComplete(SendConnector* c) : conn(c) {
    peer = c->peer();
    ready = [](WaitCondition* self) { return static_cast<SendsComplete*>(self)->conn->sendsComplete(); };
  }
  bool await_ready() { return conn->sendsComplete(); }
  void await_suspend(std::coroutine_handle<Task::promise_type> h) { h.promise().strand->blocked = this; }
  void await_resume() const {}
};

}  // namespace ridge

// RIDGE_TRY for coroutines (which must co_return).
#define RIDGE_CO_TRY(expr)             \
  do {                                 \
    ::ridge::Status ridge_s_ = (expr); \
    if (!ridge_s_.isOk()) [[unlikely]] \
      co_return ridge_s_;              \
  } while (0)
