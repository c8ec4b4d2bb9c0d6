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

}  // namespace ridge
