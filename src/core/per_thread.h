// One object of type T per thread, reached without a call of __tls_get_addr.
//
// In a shared library every use of a thread_local goes through __tls_get_addr (the
// general-dynamic TLS model); for the state that every operation touches several times (the
// group scratch, the coroutine frame pool, the executor) those calls were 2.6 % of a 64 KiB
// send/recv's profile (issue 21). Here the object keeps the default model and its address is
// cached in a pointer of the initial-exec model: one load from the thread pointer per use.
// 8 bytes of static TLS per T, which a library opened with dlopen still finds.
#pragma once

namespace ridge {

template <class T>
T& perThread() {
  static thread_local T storage;
  [[gnu::tls_model("initial-exec")]] static thread_local T* fast = nullptr;
  T* p = fast;
  if (!p) [[unlikely]]
    p = fast = &storage;
  return *p;
}

}  // namespace ridge
