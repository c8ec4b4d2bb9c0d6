// Which TCP stream carries which piece of a chunk. The sender (which piece does this stream
// send?) and the receiver (is this header on the stream it should be?) must agree for every
// 32-bit sequence number, also across the wrap at 2^32, where seq + piece overflows: both
// sides therefore reduce seq modulo the stream count before adding, which a count that does
// not divide 2^32 (3 streams, say) needs.
#pragma once

#include <cstdint>

namespace ridge {

// Pieces of chunk `seq` go to the streams round-robin, piece 0 on stream seq % streams.
inline uint32_t streamOfPiece(uint32_t seq, uint32_t piece, uint32_t streams) {
  return (seq % streams + piece) % streams;
}

// The piece of chunk `seq` that `stream` carries; the stream has none when this is not
// below the chunk's piece count.
inline uint32_t pieceOnStream(uint32_t stream, uint32_t seq, uint32_t streams) {
  return (stream + streams - seq % streams) % streams;
}

// RIDGE_SOCKET_STREAMS=0 (auto): what a rank proposes from the cores it may run on. Each
// stream has a progress thread on both ends; on a small machine the extra thread competes for
// the cores the rank's reduction and the kernel's TCP copies need (2-vCPU VM, two namespaces,
// six interleaved runs: 16 MiB allreduce median 78% of the plain two-way stream with 1 stream
// against 72% with 2, 64 MiB 76% against 74%; docs/performance.md), while a larger host needs
// several streams to fill a fast NIC.
inline uint32_t autoSocketStreams(int usableCpus) {
  return usableCpus <= 4 ? 1u : 2u;
}

// Ranks on hosts of different sizes propose different counts; both ends of a connection must
// use the same one, so every rank takes the smallest proposal (all ranks see all of them).
inline uint32_t agreedSocketStreams(const uint32_t* proposals, int n) {
  uint32_t v = proposals[0];
  for (int i = 1; i < n; ++i) v = proposals[i] < v ? proposals[i] : v;
  return v;
}

}  // namespace ridge
