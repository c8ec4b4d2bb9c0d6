// softnic's own wire: the frames one NIC's engine sends another over a TCP connection per QP
// and direction (data, acknowledgements, read responses), the hello that opens a connection,
// and the bytes of a softnic QpAddress. docs/transports.md ("softnic") has the format and rules.
#pragma once

#include <cstdint>

#include "transports/verbs/verbs.h"

namespace ridge {
namespace softnic {

using namespace verbs;

// Sequence numbers wrap at 2^32: a is before b when the signed distance is negative.
inline bool seqBefore(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) < 0;
}

constexpr uint32_t kFrameMagic = 0x4e534452u;  // "RDSN"
constexpr uint32_t kHelloMagic = 0x4f4c4548u;  // "HELO"
constexpr uint32_t kWireVersion = 2;           // 2: RDMA READ (request and response frames)

// kFrameReadResp: target -> requester on the inbound connection, always with inline payload;
// `seq` names the read request it answers, `msgOffset` the piece.
enum FrameType : uint8_t { kFrameData = 1, kFrameAck = 2, kFrameReadResp = 3 };
enum FrameFlags : uint8_t { kFrameFirst = 1, kFrameLast = 2, kFrameCmaPayload = 4 };
enum AckKind : uint8_t {
  kAckOk = 0,     // everything before `seq` arrived
  kAckNak = 1,    // same, and a later packet arrived out of order: resend from `seq` now
  kAckRnr = 2,    // same, but `seq` found no posted receive (or a full CQ): resend later
  kAckError = 3,  // `seq` was refused for good; `status` says why
};

// One packet header. Data frames are followed by `length` payload bytes unless
// kFrameCmaPayload says the target reads them from `stagingAddr` in the sender process.
struct FrameHeader {
  uint32_t magic;
  uint8_t type;
  uint8_t flags;
  uint8_t opcode;  // WqeOpcode (data) or AckKind (ack)
  uint8_t status;  // CqeStatus of a kAckError
  uint32_t seq;    // data: this packet; ack: the next sequence number expected
  uint32_t length;
  uint32_t immData;
  uint32_t msgLength;   // bytes of the whole message
  uint64_t remoteAddr;  // WRITE: where this packet lands
  uint32_t rkey;
  uint32_t msgOffset;  // offset of this packet in its message
  uint64_t stagingAddr;
};
static_assert(sizeof(FrameHeader) == 48, "frame header is 48 bytes");

// First bytes on a new connection (sender -> target), and the answer.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t srcQpn;
  uint32_t dstQpn;
  int32_t pid;
  uint32_t wantCma;
  uint64_t hostHash;
  uint64_t probeAddr;  // a word in the sender process the target tries to read
  uint64_t probeValue;
};
struct HelloReply {
  uint32_t magic;
  uint32_t status;  // 0 accepted, 1 no such QP
  uint32_t cma;     // 1: the target will read payloads out of our staging memory
  uint32_t pad;
};

// The bytes of QpAddress for softnic.
struct SoftQpAddress {
  uint32_t magic;
  uint32_t qpn;
  char endpoint[80];  // "host:port" of the NIC's engine
};
static_assert(sizeof(SoftQpAddress) <= sizeof(QpAddress), "softnic address fits QpAddress");

}  // namespace softnic
}  // namespace ridge
