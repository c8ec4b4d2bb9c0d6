/*
 * Ridge: the emulated device runtime, a testing aid (RIDGE_DEVICE=emulated).
 *
 * With RIDGE_DEVICE=emulated a process without a GPU gets emulated devices: memory that
 * the host cannot touch directly, in-order streams run by host threads, copies. Device
 * collectives then run through Ridge's device paths as on a GPU, slowly. These calls let
 * a program (ridge-bench --ridge-buffers device) select a device, copy to and from device
 * memory and use streams without CUDA. Allocate device memory with ridgeMemAlloc (on the
 * current emulated device). Every call fails with ridgeInvalidUsage, and says why in
 * ridgeGetLastError(), when RIDGE_DEVICE is not emulated. Never for production.
 */
#ifndef RIDGE_RIDGE_EMULATED_H
#define RIDGE_RIDGE_EMULATED_H

#include "ridge/ridge.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Emulated devices of this process (RIDGE_TOPO_FILE's GPUs, else 8); 0 when RIDGE_DEVICE is not emulated. */
RIDGE_API int ridgeEmulatedDeviceCount(void);
/** Makes `device` the calling thread's current emulated device (as cudaSetDevice). */
RIDGE_API ridgeResult_t ridgeEmulatedSetDevice(int device);
/** Copies `bytes` from `src` to `dst`, either or both emulated device memory; returns when done. */
RIDGE_API ridgeResult_t ridgeEmulatedMemcpy(void* dst, const void* src, size_t bytes);
/** An emulated stream of the current device, for the stream argument of collectives. */
RIDGE_API ridgeResult_t ridgeEmulatedStreamCreate(ridgeStream_t* stream);
/** Waits until everything queued on `stream` has run; reports a failure of the stream. */
RIDGE_API ridgeResult_t ridgeEmulatedStreamSynchronize(ridgeStream_t stream);
RIDGE_API ridgeResult_t ridgeEmulatedStreamDestroy(ridgeStream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RIDGE_RIDGE_EMULATED_H */
