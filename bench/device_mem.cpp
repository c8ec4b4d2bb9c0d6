// ridge-bench: device buffers through the CUDA runtime, for `--peer nccl` and
// `--ridge-buffers device`. Built with CUDA only (RIDGE_BENCH_HAVE_CUDA); without it every
// function reports "built without CUDA" so the options are refused with a clear line.
//
// With RIDGE_DEVICE=emulated (a testing aid, docs/planner.md) every call goes to Ridge's
// emulated device runtime instead (ridge/ridge_emulated.h), with or without CUDA in the build.
//
// Nothing here runs in the fork launcher itself: a process that has initialised CUDA cannot
// hand a working CUDA context to a forked child, so the launcher probes in a short-lived
// child (see main.cpp) and only the ranks touch the device.
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench.h"
#include "ridge/ridge_emulated.h"

#if defined(RIDGE_BENCH_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace rbench {
namespace cudaimpl {

#if defined(RIDGE_BENCH_HAVE_CUDA)

namespace {
bool failed(cudaError_t e, const char* what, std::string* err) {
  if (e == cudaSuccess) return false;
  (void)cudaGetLastError();
  if (err) *err = std::string(what) + ": " + cudaGetErrorString(e);
  return true;
}
}  // namespace

bool cudaBuiltIn() {
  return true;
}

int cudaDevices(std::string* err) {
  int n = 0;
  if (failed(cudaGetDeviceCount(&n), "cudaGetDeviceCount", err)) return 0;
  if (n == 0 && err) *err = "cudaGetDeviceCount: 0 devices";
  return n;
}

bool deviceSelect(int device, std::string* err) {
  return !failed(cudaSetDevice(device), "cudaSetDevice", err);
}

void* deviceAlloc(size_t bytes, std::string* err) {
  void* p = nullptr;
  if (failed(cudaMalloc(&p, bytes), "cudaMalloc", err)) return nullptr;
  return p;
}

void deviceFree(void* p) {
  if (p) (void)cudaFree(p);
}

// cudaMemcpy from pageable memory may return before the DMA has landed, on the legacy
// stream, which the non-blocking streams the collectives run on do not wait for: the device
// synchronization makes the upload complete before the next call reads the buffer.
bool copyToDevice(void* dst, const void* src, size_t bytes, std::string* err) {
  return !failed(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device", err) &&
         !failed(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the upload", err);
}

bool copyToHost(void* dst, const void* src, size_t bytes, std::string* err) {
  return !failed(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host", err);
}

void* streamCreate(std::string* err) {
  cudaStream_t s = nullptr;
  if (failed(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", err)) return nullptr;
  return s;
}

bool streamSync(void* stream, std::string* err) {
  return !failed(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize", err);
}

void streamDestroy(void* stream) {
  if (stream) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

bool graphBegin(void* stream, std::string* err) {
  // Thread-local mode: another thread's CUDA calls (Ridge's proxy) must not break the capture.
  return !failed(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal),
                 "cudaStreamBeginCapture", err);
}

void* graphEnd(void* stream, bool discard, std::string* err) {
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  if (discard) {
    (void)cudaGetLastError();
    if (graph) (void)cudaGraphDestroy(graph);
    return nullptr;
  }
  if (failed(e, "cudaStreamEndCapture", err)) return nullptr;
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (failed(ie, "cudaGraphInstantiateWithFlags", err)) return nullptr;
  return exec;
}

bool graphLaunch(void* exec, void* stream, std::string* err) {
  return !failed(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream)),
                 "cudaGraphLaunch", err);
}

void graphDestroy(void* exec) {
  if (exec) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

long long deviceMemoryUsed() {
  size_t freeBytes = 0, totalBytes = 0;
  if (cudaMemGetInfo(&freeBytes, &totalBytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return static_cast<long long>(totalBytes - freeBytes);
}

std::string deviceUnavailable() {
  std::string err;
  if (cudaDevices(&err) == 0) return "no CUDA device (" + err + ")";
  return {};
}

#else  // no CUDA in this build

namespace {
constexpr const char* kNoCuda = "this ridge-bench was built without CUDA";
void say(std::string* err) {
  if (err) *err = kNoCuda;
}
}  // namespace

bool cudaBuiltIn() {
  return false;
}
std::string deviceUnavailable() {
  return "this ridge-bench was built without CUDA (reconfigure with -DRIDGE_WITH_CUDA=ON where the CUDA "
         "toolkit is installed)";
}
int cudaDevices(std::string* err) {
  say(err);
  return 0;
}
bool deviceSelect(int, std::string* err) {
  say(err);
  return false;
}
void* deviceAlloc(size_t, std::string* err) {
  say(err);
  return nullptr;
}
void deviceFree(void*) {}
bool copyToDevice(void*, const void*, size_t, std::string* err) {
  say(err);
  return false;
}
bool copyToHost(void*, const void*, size_t, std::string* err) {
  say(err);
  return false;
}
void* streamCreate(std::string* err) {
  say(err);
  return nullptr;
}
bool streamSync(void*, std::string* err) {
  say(err);
  return false;
}
void streamDestroy(void*) {}
bool graphBegin(void*, std::string* err) {
  say(err);
  return false;
}
void* graphEnd(void*, bool, std::string* err) {
  say(err);
  return nullptr;
}
bool graphLaunch(void*, void*, std::string* err) {
  say(err);
  return false;
}
void graphDestroy(void*) {}
long long deviceMemoryUsed() {
  return -1;
}

#endif

}  // namespace cudaimpl

namespace {
bool emulated() {
  const char* v = std::getenv("RIDGE_DEVICE");
  return v && strcasecmp(v, "emulated") == 0;
}
bool emulatedOk(ridgeResult_t r, const char* what, std::string* err) {
  if (r == ridgeSuccess) return true;
  if (err) *err = std::string(what) + ": " + ridgeGetLastError(nullptr);
  return false;
}
constexpr const char* kNoGraphs = "the emulated device runtime has no graphs (-G)";
}  // namespace

bool cudaBuiltIn() {
  return emulated() || cudaimpl::cudaBuiltIn();
}
std::string deviceUnavailable() {
  if (!emulated()) return cudaimpl::deviceUnavailable();
  return ridgeEmulatedDeviceCount() > 0 ? "" : "RIDGE_DEVICE=emulated: no emulated devices";
}
int cudaDevices(std::string* err) {
  if (!emulated()) return cudaimpl::cudaDevices(err);
  const int n = ridgeEmulatedDeviceCount();
  if (n == 0 && err) *err = "RIDGE_DEVICE=emulated: no emulated devices";
  return n;
}
bool deviceSelect(int device, std::string* err) {
  if (!emulated()) return cudaimpl::deviceSelect(device, err);
  return emulatedOk(ridgeEmulatedSetDevice(device), "ridgeEmulatedSetDevice", err);
}
void* deviceAlloc(size_t bytes, std::string* err) {
  if (!emulated()) return cudaimpl::deviceAlloc(bytes, err);
  void* p = nullptr;
  return emulatedOk(ridgeMemAlloc(&p, bytes), "ridgeMemAlloc", err) ? p : nullptr;
}
void deviceFree(void* p) {
  if (!emulated()) return cudaimpl::deviceFree(p);
  if (p) (void)ridgeMemFree(p);
}
bool copyToDevice(void* dst, const void* src, size_t bytes, std::string* err) {
  if (!emulated()) return cudaimpl::copyToDevice(dst, src, bytes, err);
  return emulatedOk(ridgeEmulatedMemcpy(dst, src, bytes), "ridgeEmulatedMemcpy to device", err);
}
bool copyToHost(void* dst, const void* src, size_t bytes, std::string* err) {
  if (!emulated()) return cudaimpl::copyToHost(dst, src, bytes, err);
  return emulatedOk(ridgeEmulatedMemcpy(dst, src, bytes), "ridgeEmulatedMemcpy to host", err);
}
void* streamCreate(std::string* err) {
  if (!emulated()) return cudaimpl::streamCreate(err);
  ridgeStream_t s = nullptr;
  return emulatedOk(ridgeEmulatedStreamCreate(&s), "ridgeEmulatedStreamCreate", err) ? s : nullptr;
}
bool streamSync(void* stream, std::string* err) {
  if (!emulated()) return cudaimpl::streamSync(stream, err);
  return emulatedOk(ridgeEmulatedStreamSynchronize(static_cast<ridgeStream_t>(stream)),
                    "ridgeEmulatedStreamSynchronize", err);
}
void streamDestroy(void* stream) {
  if (!emulated()) return cudaimpl::streamDestroy(stream);
  if (stream) (void)ridgeEmulatedStreamDestroy(static_cast<ridgeStream_t>(stream));
}
bool graphBegin(void* stream, std::string* err) {
  if (!emulated()) return cudaimpl::graphBegin(stream, err);
  if (err) *err = kNoGraphs;
  return false;
}
void* graphEnd(void* stream, bool discard, std::string* err) {
  if (!emulated()) return cudaimpl::graphEnd(stream, discard, err);
  if (err) *err = kNoGraphs;
  return nullptr;
}
bool graphLaunch(void* exec, void* stream, std::string* err) {
  if (!emulated()) return cudaimpl::graphLaunch(exec, stream, err);
  if (err) *err = kNoGraphs;
  return false;
}
void graphDestroy(void* exec) {
  if (!emulated()) cudaimpl::graphDestroy(exec);
}
long long deviceMemoryUsed() {
  return emulated() ? -1 : cudaimpl::deviceMemoryUsed();
}

}  // namespace rbench
