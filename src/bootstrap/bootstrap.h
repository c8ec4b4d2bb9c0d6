// Bootstrap: how ranks find each other before any transport exists, and the small
// out-of-band collectives they need while setting transports up.
//
// Rendezvous. One process creates a unique id (createUniqueId): that starts a root
// service thread listening on a TCP socket and writes the socket address plus a random
// 64-bit secret into the 128-byte id (ridgeCommInitFromEnv derives the secret from
// RIDGE_JOB_KEY or the launcher's job id instead, launcher_env.h). The secret never goes on
// the wire: the root sends every connection a random challenge, and a rank answers with a
// hello (its rank, the rank count, the address of its own listening socket) tagged with the
// secret (auth.h, wire.h). A hello that does not authenticate, or garbage, is dropped and
// logged and never disturbs the job; every connection has its own deadline, so silent ones
// cannot hold the others up. When all ranks have reported, the root sends each the table of
// listening addresses and a random session nonce, and exits. Ranks then connect a ring
// (rank -> rank+1) for the collectives, and open direct connections lazily for tagged
// point-to-point messages; those open with the session nonce, and each rank's listener
// reads all handshakes in progress at once, each with its own deadline. Who can join a job
// is written down in docs/reliability.md ("Rendezvous threat model").
//
// Every wait is bounded by the connect timeout (or the timeout given at connect for the
// later operations) and cancelled by the abort flag. A Bootstrap object is not thread
// safe: one thread at a time may call its operations.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/socket.h"
#include "core/status.h"
#include "ridge/ridge.h"

namespace ridge {

// Layout of ridgeUniqueId.internal (host byte order; ids travel between hosts of one
// architecture):
//   [0,4)    magic kUniqueIdMagic
//   [4,6)    layout version
//   [6,8)    address family (AF_INET / AF_INET6)
//   [8,16)   secret of the job (the "nonce"; the key of auth.h derives from it)
//   [16,20)  sockaddr length
//   [20,48)  sockaddr_in / sockaddr_in6 of the root
//   [124,128) checksum of bytes [0,124)
constexpr uint32_t kUniqueIdMagic = 0x44494252u;  // "RBID" in memory order
constexpr uint16_t kUniqueIdVersion = 1;

// The decoded contents of a unique id.
struct UniqueIdInfo {
  SocketAddress root;
  uint64_t nonce = 0;
};

// Fills `out` from a root address and a nonce.
void encodeUniqueId(const SocketAddress& root, uint64_t nonce, ridgeUniqueId* out);
// Checks magic, version, checksum and the address; ridgeInvalidArgument when malformed.
Status decodeUniqueId(const ridgeUniqueId& id, UniqueIdInfo* out);

// A random 64-bit value from the kernel (getrandom), never 0.
uint64_t randomNonce();

// Chooses the interface (RIDGE_SOCKET_IFNAME), starts the detached root service on an
// ephemeral port of it and writes the id. The service handles one rendezvous, then
// exits; it gives up after RIDGE_TIMEOUT seconds (WARN line).
Status createUniqueId(ridgeUniqueId* out);
// Runs the root service in this process on exactly `hostPort` (env-based init: rank 0).
Status startRootService(const std::string& hostPort, uint64_t nonce);
// Lower level: listens on `bindAddr` (port 0 picks one), writes the actual address to
// *bound. timeoutSec <= 0 reads RIDGE_TIMEOUT.
Status startRootServiceOn(const SocketAddress& bindAddr, uint64_t nonce, SocketAddress* bound,
                          int timeoutSec = 0);
// Builds the id that names the root at `hostPort` with `nonce` (no socket is opened).
Status uniqueIdFromAddress(const std::string& hostPort, uint64_t nonce, ridgeUniqueId* out);
// Root service threads of this process still running (tests use it to check exits).
int activeRootServices();

// Internal: logs accept() failing for lack of descriptors or memory (the listener then backs
// off) at most once per 5 s per listener, with the count since the last line, so that a flood
// cannot flood the log.
struct AcceptErrorLog {
  std::chrono::steady_clock::time_point lastWarn{};
  int sinceWarn = 0;
  void note(const std::string& who, int err, const char* dropped);
};

class Bootstrap {
 public:
  // Rendezvous of rank `rank` of `nranks` through the root named in `id`, then the ring.
  // timeoutSec bounds the whole connect and, later, each operation (<= 0: RIDGE_TIMEOUT).
  // Errors: ridgeInvalidArgument (malformed id, bad rank/nranks, ranks disagreeing on
  // nranks, a rank claimed twice, the nonce of another job), ridgeTimeout,
  // ridgeRemoteError (a peer or the root closed), ridgeAborted (*abortFlag became true).
  static Status connect(const ridgeUniqueId& id, int rank, int nranks, int timeoutSec,
                        const std::atomic<bool>* abortFlag, std::unique_ptr<Bootstrap>* out);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Listening address of every rank (as reported to the root).
  const std::vector<SocketAddress>& peerAddresses() const { return peers_; }
  int timeoutSec() const { return timeoutSec_; }
  // The session nonce the root handed out (rank-to-rank handshakes carry it; tests forge them).
  uint64_t sessionNonce() const { return nonce_; }

  // In-place all-gather over the ring: data holds nranks*bytesPerRank bytes, this rank's
  // block at rank*bytesPerRank.
  Status allGather(void* data, size_t bytesPerRank);
  Status barrier();
  Status broadcast(void* data, size_t bytes, int root);
  // Tagged point-to-point over a direct connection per direction (opened on first use).
  // Messages arrive in order per (peer, direction); a recv for one tag buffers messages
  // of other tags that come first. The size must match what the sender sent. waitSec > 0
  // bounds this receive instead of the bootstrap's timeout (ridgeCommShrink: survivors that
  // noticed a failure up to one timeout apart still meet).
  Status send(int peer, uint32_t tag, const void* data, size_t bytes);
  Status recv(int peer, uint32_t tag, void* data, size_t bytes, int waitSec = 0);
  // Closes every socket. Safe to call twice; later operations fail with ridgeInvalidUsage.
  void close();

  // Largest payload of one framed message.
  static constexpr uint64_t kMaxMessageBytes = 1ull << 30;
  // Most bytes of early (other-tag) messages buffered per peer before recv fails.
  static constexpr uint64_t kMaxBufferedBytes = 256ull << 20;

 private:
  struct Pending {
    uint32_t tag;
    std::vector<char> data;
  };
  // A connection to our listener whose handshake has not fully arrived yet.
  struct Incoming {
    Socket sock;
    SocketAddress from;
    std::chrono::steady_clock::time_point giveUpAt;
    size_t got = 0;
    char buf[32 + 8];  // MsgHeader + Handshake (wire.h; static_assert in bootstrap.cpp)
  };

  Bootstrap() = default;
  Deadline deadline() const { return Deadline::after(timeoutSec_, abortFlag_); }
  std::string peerName(int peer) const;
  Status checkOpen(const char* op) const;
  // Accepts incoming connections (ring or point-to-point) until `ready()` holds.
  template <typename Pred>
  Status acceptUntil(const Deadline& d, const char* waitingFor, Pred ready);
  // One poll slice over the listener and every handshake in progress: accepts, reads,
  // places finished handshakes (ring or point-to-point) and drops bad or late ones.
  Status serveListener(const Deadline& d, const std::string& who);
  void placeHandshake(Incoming& in);
  Status connectTo(int peer, uint32_t kind, const Deadline& d, Socket* out);
  // Sends one framed message on `fd` while receiving one from `recvFd` (either may be -1).
  Status exchange(int sendFd, int sendPeer, uint32_t tag, const void* sendData, size_t sendBytes, int recvFd,
                  int recvPeer, void* recvData, size_t recvBytes, const Deadline& d);
  Status ringAllGather(void* data, size_t bytesPerRank, uint32_t tag);

  int rank_ = -1;
  int nranks_ = 0;
  int timeoutSec_ = 0;
  uint64_t nonce_ = 0;
  const std::atomic<bool>* abortFlag_ = nullptr;
  bool closed_ = false;
  std::vector<SocketAddress> peers_;
  Socket listen_;
  Socket ringNext_;  // we send on it
  Socket ringPrev_;  // we receive on it
  std::vector<Socket> sendConn_;
  std::vector<Socket> recvConn_;
  std::vector<std::deque<Pending>> pending_;
  std::vector<uint64_t> pendingBytes_;
  std::vector<Incoming> incoming_;
  std::chrono::steady_clock::time_point acceptPausedUntil_{};  // accept() backs off until then
  AcceptErrorLog acceptErrors_;
};

// A stable identity of this host for grouping ranks that can share memory: hostname,
// boot id and IPC namespace, e.g. "node7|3f2c...|ipc:[4026531839]".
std::string hostIdentity();
// 64-bit hash of hostIdentity().
uint64_t hostHash();

}  // namespace ridge
