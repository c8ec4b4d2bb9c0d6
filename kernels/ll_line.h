// The line format of the low-latency (LL) small-message protocol: flags stored with the
// data, so a receiver learns that data has arrived from the data's own memory, with no
// separate "ready" word, no fence and no second round trip.
//
// A line is 16 bytes: 8 bytes of payload, cut into two 4-byte halves, each followed by a
// 4-byte copy of the step's flag:
//
//     bytes  0..3   payload bytes 0..3
//     bytes  4..7   flag
//     bytes  8..11  payload bytes 4..7
//     bytes 12..15  flag
//
// Why two flags and not 8 bytes of data + one 8-byte flag: the sender writes the line with
// one 16-byte store, which another agent (a peer GPU over NVLink/PCIe, or the host) need not
// see whole: it may become two 8-byte writes that land in either order. (The PTX model
// guarantees only 4-byte elements of a vector store; an aligned 8-byte half seen whole is
// relied on, as NCCL's LL does with the same layout.) With {data, flag, data, flag} every
// 8-byte half carries its own flag, so "both flags equal the expected value" proves both
// halves are this step's, whatever the order. With {8 B data, 8 B flag} the flag half could land
// first and the receiver would read the previous step's data. The price is 50% payload
// efficiency, which is why LL is for small messages only and bulk transfers use the
// plain copy/reduce kernels.
//
// Flags: a buffer starts zeroed, so flag 0 is never used; each use of a buffer (a "step")
// takes flagForStep(step), which differs from the previous step's flag, so stale lines
// from the last use never look ready, and receivers need not clear a buffer between steps.
// A line that is never rewritten, though, meets its flag again 2^32 - 1 steps later: the LL
// collectives (ll_collective.h) therefore zero every line they consumed.
//
// The functions are plain inline code usable from host and device (`__host__ __device__`
// under nvcc, ordinary inline functions elsewhere): the device kernels in ll_protocol.cu
// and a host-side test (tests/gpu/test_ll_line.cpp, built in every build) share them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace ridge::ll {

struct alignas(16) Line {
  uint32_t data0;
  uint32_t flag0;
  uint32_t data1;
  uint32_t flag1;
};
static_assert(sizeof(Line) == 16, "an LL line is 16 bytes");

constexpr size_t kLinePayload = 8;  // payload bytes per 16-byte line

/// Lines that carry `bytes` bytes (the last one zero-padded).
RIDGE_HOST_DEVICE inline size_t linesFor(size_t bytes) {
  return (bytes + kLinePayload - 1) / kLinePayload;
}

/// The flag of a buffer's step `step`: 1 .. 2^32-1, never 0 (a zeroed buffer) and never
/// the flag of step - 1 (the cycle has 2^32-1 values, so consecutive steps always differ).
RIDGE_HOST_DEVICE inline uint32_t flagForStep(uint64_t step) {
  return static_cast<uint32_t>(step % 0xFFFFFFFFull) + 1u;
}

RIDGE_HOST_DEVICE inline Line encode(uint64_t payload, uint32_t flag) {
  Line l;
  l.data0 = static_cast<uint32_t>(payload);
  l.flag0 = flag;
  l.data1 = static_cast<uint32_t>(payload >> 32);
  l.flag1 = flag;
  return l;
}

/// Whether both halves of `l` belong to the step with `flag`.
RIDGE_HOST_DEVICE inline bool ready(const Line& l, uint32_t flag) {
  return l.flag0 == flag && l.flag1 == flag;
}

RIDGE_HOST_DEVICE inline uint64_t payloadOf(const Line& l) {
  return static_cast<uint64_t>(l.data0) | (static_cast<uint64_t>(l.data1) << 32);
}

/// Payload of line i of a `bytes`-byte message: bytes [8i, 8i + 8) in memory order
/// (little-endian, as on every host and GPU Ridge runs on), zeros past the end.
RIDGE_HOST_DEVICE inline uint64_t loadPayload(const unsigned char* src, size_t bytes, size_t i) {
  const size_t at = i * kLinePayload;
  if (at + kLinePayload <= bytes && (reinterpret_cast<uintptr_t>(src + at) & 7) == 0) {
#if defined(__CUDA_ARCH__)
    return *reinterpret_cast<const uint64_t*>(src + at);  // one 8-byte load
#else
    uint64_t whole;
    std::memcpy(&whole, src + at, sizeof whole);
    return whole;
#endif
  }
  uint64_t v = 0;
  for (size_t b = 0; b < kLinePayload && at + b < bytes; ++b)
    v |= static_cast<uint64_t>(src[at + b]) << (8 * b);
  return v;
}

/// Writes line i's payload back to a `bytes`-byte message; nothing past its end.
RIDGE_HOST_DEVICE inline void storePayload(unsigned char* dst, size_t bytes, size_t i, uint64_t v) {
  const size_t at = i * kLinePayload;
  if (at + kLinePayload <= bytes && (reinterpret_cast<uintptr_t>(dst + at) & 7) == 0) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<uint64_t*>(dst + at) = v;
#else
    std::memcpy(dst + at, &v, sizeof v);
#endif
    return;
  }
  for (size_t b = 0; b < kLinePayload && at + b < bytes; ++b)
    dst[at + b] = static_cast<unsigned char>(v >> (8 * b));
}

/// Host form of a send (the device kernel does the same per thread): the message as lines
/// carrying `flag`.
RIDGE_HOST_DEVICE inline void packMessage(const void* src, size_t bytes, uint32_t flag, Line* lines) {
  const size_t n = linesFor(bytes);
  for (size_t i = 0; i < n; ++i)
    lines[i] = encode(loadPayload(static_cast<const unsigned char*>(src), bytes, i), flag);
}

/// Host form of a receive without waiting: copies out every ready line and returns how many
/// lines are not ready yet (0: the whole message is there and in `dst`).
RIDGE_HOST_DEVICE inline size_t unpackMessage(const Line* lines, size_t bytes, uint32_t flag, void* dst) {
  const size_t n = linesFor(bytes);
  size_t missing = 0;
  for (size_t i = 0; i < n; ++i) {
    const Line l = lines[i];
    if (!ready(l, flag)) {
      ++missing;
      continue;
    }
    storePayload(static_cast<unsigned char*>(dst), bytes, i, payloadOf(l));
  }
  return missing;
}

}  // namespace ridge::ll
