// Bookkeeping of the socket transport that a run cannot reach in test time: 32-bit
// sequence numbers wrap after 2^32 chunks on one connection (hours of small messages).
#include "transports/socket/socket_pieces.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>

#include "core/settings.h"

namespace {
using ridge::pieceOnStream;
using ridge::streamOfPiece;

// Around the wrap, for every stream count: each piece of a chunk is on a different stream,
// and the stream the receiver expects a piece on is the one whose sender sends that piece.
// (The receiver once checked (seq + piece) % streams, which overflows at the wrap and,
// with 3 streams, refused a valid header of chunk 2^32 - 2.)
TEST(SocketPieces, SenderAndReceiverAgreeAcrossTheWrap) {
  for (uint32_t streams = 1; streams <= 16; ++streams) {
    for (uint32_t k = 0; k < 80; ++k) {
      const uint32_t seq = static_cast<uint32_t>(0xFFFFFFFFu - 40u + k);  // wraps past 0
      std::set<uint32_t> used;
      for (uint32_t piece = 0; piece < streams; ++piece) {
        const uint32_t stream = streamOfPiece(seq, piece, streams);
        ASSERT_LT(stream, streams);
        EXPECT_EQ(pieceOnStream(stream, seq, streams), piece) << "seq " << seq << " streams " << streams;
        used.insert(stream);
      }
      EXPECT_EQ(used.size(), streams) << "seq " << seq;
    }
  }
}

// Slot counts that do not divide 2^32 would put the chunks just before and just after the
// wrap into one slot: they are rounded down to a power of two.
TEST(SocketPieces, SlotCountsArePowersOfTwo) {
  struct Case {
    const char* value;
    uint32_t expect;
  };
  for (const Case& c : {Case{"2", 2}, Case{"3", 2}, Case{"4", 4}, Case{"5", 4}, Case{"48", 32},
                        Case{"64", 64}, Case{"1", 4}, Case{"65", 4}, Case{"-3", 4}}) {
    setenv("RIDGE_SOCKET_SLOTS", c.value, 1);
    const uint32_t n = ridge::settingSlotCount(ridge::Setting::SOCKET_SLOTS, 64, 4);
    EXPECT_EQ(n, c.expect) << "RIDGE_SOCKET_SLOTS=" << c.value;
    EXPECT_EQ((uint64_t{1} << 32) % n, 0u);
  }
  unsetenv("RIDGE_SOCKET_SLOTS");
}

// RIDGE_SOCKET_STREAMS=0: one stream on small machines (measured, docs/performance.md),
// two on larger ones, and every rank takes the smallest proposal so both ends agree.
TEST(SocketPieces, AutoStreamCountFromCoresAndTheSmallestProposalWins) {
  EXPECT_EQ(ridge::autoSocketStreams(1), 1u);
  EXPECT_EQ(ridge::autoSocketStreams(2), 1u);
  EXPECT_EQ(ridge::autoSocketStreams(4), 1u);
  EXPECT_EQ(ridge::autoSocketStreams(5), 2u);
  EXPECT_EQ(ridge::autoSocketStreams(192), 2u);
  const uint32_t mixed[] = {2, 2, 1, 2};
  EXPECT_EQ(ridge::agreedSocketStreams(mixed, 4), 1u);
  const uint32_t same[] = {2, 2, 2};
  EXPECT_EQ(ridge::agreedSocketStreams(same, 3), 2u);
  const uint32_t firstSmallest[] = {1, 2};
  EXPECT_EQ(ridge::agreedSocketStreams(firstSmallest, 2), 1u);
}

}  // namespace
