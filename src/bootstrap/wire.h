// Wire format of the bootstrap connections (internal; exposed so tests can forge
// malformed traffic). Every message on every bootstrap connection is a MsgHeader
// followed by `length` bytes. Integers are in host byte order.
//
// Rendezvous (protocol 2): the root sends a Challenge on every connection it accepts; the
// rank answers with a Hello whose `mac` tags the challenge and the hello's fields with the
// job's key (auth.h); the root answers with a ReplyHead (and, on success, the address
// table), tagged the same way, which carries the session nonce: a random value the root
// draws for this rendezvous and hands only to ranks that proved the key. Rank-to-rank
// connections open with a Handshake carrying that session nonce.
#pragma once

#include <netinet/in.h>

#include <cstdint>

namespace ridge::bootstrap_wire {

constexpr uint32_t kMsgMagic = 0x474D4252u;        // "RBMG"
constexpr uint32_t kHelloMagic = 0x4F4C4548u;      // "HELO"
constexpr uint32_t kHandshakeMagic = 0x4B534848u;  // "HHSK"
constexpr uint32_t kChallengeMagic = 0x4C484352u;  // "RCHL"
constexpr uint32_t kProtocolVersion = 2;

constexpr uint32_t kTagHello = 0xFFFFFF01u;
constexpr uint32_t kTagChallenge = 0xFFFFFF03u;
constexpr uint32_t kTagReply = 0xFFFFFF02u;
constexpr uint32_t kTagAllGather = 0xFFFFFF10u;
constexpr uint32_t kTagBarrier = 0xFFFFFF11u;
constexpr uint32_t kTagBroadcast = 0xFFFFFF12u;

// Connection kinds in a Handshake (also the tag of its header).
constexpr uint32_t kKindRing = 1;
constexpr uint32_t kKindP2P = 2;

struct MsgHeader {
  uint32_t magic;
  uint32_t tag;
  uint64_t length;
};
static_assert(sizeof(MsgHeader) == 16);

struct WireAddr {
  uint32_t length;
  uint8_t bytes[28];
};
static_assert(sizeof(WireAddr) == 32);
static_assert(sizeof(sockaddr_in6) <= 28 && sizeof(sockaddr_in) <= 28);

// Root -> rank, first on every accepted connection: a fresh random challenge.
struct Challenge {
  uint32_t magic;    // kChallengeMagic
  uint32_t version;  // kProtocolVersion
  uint64_t challenge;
};
static_assert(sizeof(Challenge) == 16);

// Rank -> root: who I am and where I listen. mac = helloMac(key, challenge, hello).
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t mac;
  int32_t rank;
  int32_t nranks;
  WireAddr listen;
};
static_assert(sizeof(Hello) == 56);

// Root -> rank: code 0 and nranks WireAddr entries follow, or an error code and text.
// mac tags the challenge of this connection, this head (with mac 0) and the table.
struct ReplyHead {
  int32_t code;
  int32_t nranks;
  uint64_t session;  // the session nonce (code 0 only)
  uint64_t mac;
  char message[232];
};
static_assert(sizeof(ReplyHead) == 256);

// First message on a rank-to-rank connection.
struct Handshake {
  uint32_t magic;
  uint32_t kind;
  uint64_t nonce;
  int32_t fromRank;
  int32_t toRank;
};
static_assert(sizeof(Handshake) == 24);

}  // namespace ridge::bootstrap_wire
