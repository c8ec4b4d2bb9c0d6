// Small collectives on device memory through the LL protocol, launched straight onto the
// caller's stream: no proxy thread, no host connector, no synchronize (docs/gpu.md, "LL
// collectives").
//
// At init (setupLL, collective), when RIDGE_LL allows it, every rank serves a device, all
// ranks are on this host and every pair may use P2P (the P2P engine's rules,
// src/coll/device/p2p.h), each rank allocates an LL area in device memory (one slot per
// peer and parity, linesFor(RIDGE_LL_MAX_BYTES) lines each), zeroes it, and the ranks
// exchange IPC handles (or pointers, within one process) through the bootstrap and open each
// other's areas; a second exchange confirms that every rank opened every area, so all ranks
// enable LL or none does.
//
// Per operation (launchLL, on the calling thread): one fused launch on the caller's stream
// (DeviceRuntime::launchLLCollective, kernels/ll_collective.h) with the communicator's next
// LL operation number: parity = number & 1 picks the slots, flagForStep(number) the flag.
// A marker recorded after each launch orders the next one, on whatever stream, so a
// communicator's LL operations run in issue order on each rank. A status word (host
// memory the device reads) stops spinning launches: the kernel moves it to base + ll::kTimedOut
// on a timeout (which becomes the communicator's asynchronous error), abort and the destroy
// of a broken communicator to base + ll::kAborted.
#pragma once

#include <cstddef>
#include <cstdint>

#include "coll/device/gpu_proxy.h"
#include "core/status.h"
#include "device/runtime.h"

struct ridgeComm;

namespace ridge {

struct LLState;
struct LLStateDeleter {
  void operator()(LLState* s) const;
};

// RIDGE_LL_MAX_BYTES bounds.
constexpr size_t kMinLLMaxBytes = 8;
constexpr size_t kMaxLLMaxBytes = size_t(1) << 20;

// Decides whether the communicator uses LL and builds its areas (every rank calls it, after
// the transports are up: it exchanges through the bootstrap). Allocates and may synchronize
// the device: init only. Not ok only when the exchange itself fails; a rank that cannot take
// part turns LL off for all.
Status setupLL(ridgeComm* comm);

// Frees the areas, mappings, marker and status word (destroy and abort). Moves the status word
// to base + kAborted first when the communicator was aborted or broken, then waits until the
// last LL launch has left the stream (destroy: up to its timeout + 5 s; abort: 1 s); if it has
// not (or a launch's marker could not be recorded), leaks the memory rather than free what a
// kernel may still touch. An aborted or broken communicator never frees its own area: a
// peer's queued launch may still store lines into it.
void releaseLL(ridgeComm* comm);

// Whether `op` goes through LL on this communicator: LL is on, the operation is a collective
// with at least one element, count x element size <= the agreed RIDGE_LL_MAX_BYTES, and every
// buffer it uses is device or managed memory (the API routes host memory elsewhere). Every
// rank decides alike for the same collective, since these are all the same on every rank.
bool llTakes(const ridgeComm* comm, const DeviceOp& op);

// Queues `op` (llTakes) on its stream. Never blocks. A failure breaks the communicator (its
// peers' launches would wait for lines this rank never sends): it becomes the asynchronous
// error.
Status launchLL(ridgeComm* comm, device::DeviceRuntime* rt, const DeviceOp& op);

// Makes the first of `streams` (a group's distinct streams, in the order of their first LL
// operation) wait until every one of them has reached this point, so that the group's LL
// operations, launched next in call order (each after the previous one), start only once every
// stream of the group reached the group, as a proxy batch does. Never blocks.
Status joinLLStreams(ridgeComm* comm, device::DeviceRuntime* rt, const ridgeStream_t* streams, size_t n);

// Makes every one of `streams` (the group's distinct LL streams) wait for the group's last LL
// launch. Each launch starts after the previous one finished (issue order, launchLL), so the
// last one's end is the end of the whole group: work the caller queues next on any stream of
// the group sees every output of the group, as after a proxy batch (docs/gpu.md, "Groups").
// Never blocks.
Status leaveLLGroup(ridgeComm* comm, device::DeviceRuntime* rt, const ridgeStream_t* streams, size_t n);

// Turns a status word set by a timed-out launch into the communicator's asynchronous error
// (ridgeTimeout, with a text saying so). Cheap: one load of a host word.
void pollLLStatus(ridgeComm* comm);

struct LLStats {
  bool enabled = false;
  size_t maxBytes = 0;    // the agreed RIDGE_LL_MAX_BYTES
  uint64_t launches = 0;  // operations launched through LL
  uint64_t nextOp = 0;    // the next operation number
};
LLStats llStats(const ridgeComm* comm);

// Tests: the next LL operation number (every rank must set the same), e.g. just below the
// 2^32 - 1 wrap of the flags; rounded up to the parity of the number it replaces, so the slots
// still alternate.
void setNextLLOpForTesting(ridgeComm* comm, uint64_t op);

}  // namespace ridge
