#include "bootstrap/bootstrap.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <system_error>
#include <thread>

#include "bootstrap/auth.h"
#include "bootstrap/init_stage.h"
#include "bootstrap/wire.h"
#include "core/log.h"
#include "core/settings.h"

namespace ridge {

using namespace bootstrap_wire;

namespace {

// Limit on ranks in one rendezvous (bounds what a malformed hello can make the root allocate).
constexpr int kMaxRanks = 1 << 16;
static_assert(sizeof(MsgHeader) + sizeof(Handshake) == 40, "Bootstrap::Incoming::buf");
// How long the root or a rank waits for the first bytes of a fresh connection.
constexpr std::chrono::milliseconds kHandshakeWait{5000};

WireAddr toWire(const SocketAddress& a) {
  WireAddr w{};
  w.length = std::min<uint32_t>(a.length, sizeof w.bytes);
  std::memcpy(w.bytes, &a.storage, w.length);
  return w;
}

bool fromWire(const WireAddr& w, SocketAddress* out) {
  if (w.length > sizeof w.bytes) return false;
  SocketAddress a = SocketAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(w.bytes), w.length);
  if (!a.valid() || a.length != w.length || a.port() == 0) return false;
  *out = a;
  return true;
}

uint32_t fnv1a32(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}

uint64_t fnv1a64(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

bool validResultCode(int32_t code) {
  return code > 0 && code < ridgeNumResults;
}

std::string truncated(const std::string& s, size_t max) {
  return s.size() <= max ? s : s.substr(0, max);
}

// ---- Root service ------------------------------------------------------------------------

std::atomic<int> gActiveRootServices{0};

// Most connections the root (or a rank's listener) keeps waiting for their first message at
// once. A flood of silent connections evicts the oldest: a genuine rank answers its challenge
// within microseconds, so it is never the oldest for long.
constexpr size_t kMaxPendingConnections = 256;
// How long accept() is left alone after it failed for lack of descriptors or memory (EMFILE,
// ENFILE, ENOBUFS, ENOMEM): the listener stays readable, so retrying at once would spin.
constexpr std::chrono::milliseconds kAcceptBackoff{100};
// Dropped connections logged one by one (WARN) per listener; later ones are only counted.
constexpr int kMaxDropWarnings = 16;

bool acceptResourceError(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

uint64_t helloMac(const auth::Key& key, uint64_t challenge, const Hello& h) {
  return auth::Tagger("HELO")
      .field(challenge)
      .field(h.magic)
      .field(h.version)
      .field(h.rank)
      .field(h.nranks)
      .field(h.listen)
      .tag(key);
}

uint64_t replyMac(const auth::Key& key, uint64_t challenge, const ReplyHead& head, const void* table,
                  size_t tableBytes) {
  ReplyHead zeroed = head;
  zeroed.mac = 0;
  return auth::Tagger("RPLY").field(challenge).field(zeroed).append(table, tableBytes).tag(key);
}

// Counts and logs dropped connections (the first kMaxDropWarnings at WARN).
class DropLog {
 public:
  explicit DropLog(std::string who) : who_(std::move(who)) {}
  ~DropLog() {
    if (dropped_ > kMaxDropWarnings)
      RIDGE_WARN("%s: %d connections dropped in all (%d not logged one by one)", who_.c_str(), dropped_,
                 dropped_ - kMaxDropWarnings);
  }
  template <typename... Args>
  void drop(const char* fmt, Args... args) {
    if (++dropped_ <= kMaxDropWarnings) {
      std::string line = format(fmt, args...);
      RIDGE_WARN("%s: %s%s", who_.c_str(), line.c_str(),
                 dropped_ == kMaxDropWarnings ? " (further drops are counted, not logged)" : "");
    }
  }
  int dropped() const { return dropped_; }

 private:
  std::string who_;
  int dropped_ = 0;
};

}  // namespace

void AcceptErrorLog::note(const std::string& who, int err, const char* dropped) {
  ++sinceWarn;
  const auto now = std::chrono::steady_clock::now();
  if (lastWarn != std::chrono::steady_clock::time_point{} && now - lastWarn < std::chrono::seconds(5)) return;
  RIDGE_WARN("%s: accept: %s; %s and backing off %lld ms (%d such failures since the last line)", who.c_str(),
             std::strerror(err), dropped, (long long)kAcceptBackoff.count(), sinceWarn);
  lastWarn = now;
  sinceWarn = 0;
}

namespace {

class RootService {
 public:
  RootService(Socket listener, SocketAddress addr, uint64_t secret, int timeoutSec)
      : listener_(std::move(listener)),
        addr_(addr),
        key_(auth::keyFromSecret(secret)),
        session_(randomNonce()),
        timeoutSec_(timeoutSec),
        who_("bootstrap root at " + addr_.toString()),
        drops_(who_) {}
  void run();

 private:
  struct Member {
    Socket sock;
    SocketAddress listen;
    SocketAddress from;
    uint64_t challenge = 0;
  };

  // A connection whose hello has not fully arrived yet.
  struct Incoming {
    Socket sock;
    SocketAddress from;
    std::chrono::steady_clock::time_point giveUpAt;
    uint64_t challenge = 0;
    size_t got = 0;
    char buf[sizeof(MsgHeader) + sizeof(Hello)];
  };

  void acceptPending();
  // Reads what is available; true when the connection is finished with (handled or dropped).
  bool progressIncoming(Incoming& in, const Deadline& deadline);
  void handleHello(Incoming& in, const Hello& hello, const Deadline& deadline);
  void sendReply(int fd, uint64_t challenge, const Status& status, const std::vector<WireAddr>* table,
                 const Deadline& d, const std::string& to);
  void fail(const Status& status, const Deadline& d);
  std::string missingRanks() const;

  Socket listener_;
  SocketAddress addr_;
  auth::Key key_;
  uint64_t session_;
  int timeoutSec_;
  std::string who_;
  DropLog drops_;
  int nranks_ = -1;
  int arrived_ = 0;
  std::vector<Member> members_;
  std::deque<Incoming> incoming_;
  std::chrono::steady_clock::time_point acceptPausedUntil_{};
  AcceptErrorLog acceptErrors_;
  bool failed_ = false;
  Status failure_;
  bool done_ = false;
};

void RootService::sendReply(int fd, uint64_t challenge, const Status& status, const std::vector<WireAddr>* table,
                            const Deadline& d, const std::string& to) {
  ReplyHead head{};
  head.code = status.isOk() ? 0 : static_cast<int32_t>(status.code());
  head.nranks = table ? static_cast<int32_t>(table->size()) : 0;
  head.session = status.isOk() ? session_ : 0;
  std::string msg = truncated(status.message(), sizeof head.message - 1);
  std::memcpy(head.message, msg.data(), msg.size());
  size_t tableBytes = table ? table->size() * sizeof(WireAddr) : 0;
  head.mac = replyMac(key_, challenge, head, table ? table->data() : nullptr, tableBytes);
  MsgHeader h{kMsgMagic, kTagReply, sizeof head + tableBytes};
  iovec iov[3] = {{&h, sizeof h}, {&head, sizeof head}, {table ? (void*)table->data() : nullptr, tableBytes}};
  Status s = sendAllv(fd, iov, 3, d.capped(kHandshakeWait), who_ + ": reply to " + to);
  if (!s.isOk())
    RIDGE_WARN("%s: could not send the reply to %s: %s", who_.c_str(), to.c_str(), s.message().c_str());
}

std::string RootService::missingRanks() const {
  std::string list;
  int shown = 0, missing = 0;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    if (members_[r].sock.valid()) continue;
    ++missing;
    if (shown < 16) {
      if (!list.empty()) list += ',';
      list += std::to_string(r);
      ++shown;
    }
  }
  if (missing > shown) list += format(",... (%d in all)", missing);
  return list;
}

void RootService::fail(const Status& status, const Deadline& d) {
  failed_ = true;
  failure_ = status;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    if (!members_[r].sock.valid()) continue;
    sendReply(members_[r].sock.fd(), members_[r].challenge, status, nullptr, d, format("rank %d", r));
    members_[r].sock.reset();
  }
}

void RootService::handleHello(Incoming& in, const Hello& hello, const Deadline& deadline) {
  std::string fromText = in.from.toString();
  if (hello.magic != kHelloMagic || hello.version != kProtocolVersion) {
    drops_.drop("dropping a hello from %s: bootstrap protocol version %u, this root speaks %u", fromText.c_str(),
                hello.version, kProtocolVersion);
    sendReply(in.sock.fd(), in.challenge,
              Status(ridgeInvalidArgument,
                     format("%s: rank at %s speaks bootstrap protocol version %u, this root speaks %u",
                            who_.c_str(), fromText.c_str(), hello.version, kProtocolVersion)),
              nullptr, deadline, fromText);
    return;
  }
  if (hello.mac != helloMac(key_, in.challenge, hello)) {
    // A rank of another job (another id or RIDGE_JOB_KEY), a stale one or a forger: refuse
    // this connection alone and keep serving the job. Nothing it claimed is believed.
    drops_.drop("dropping a hello from %s (claims rank %d of %d): it does not authenticate with this job's key",
                fromText.c_str(), hello.rank, hello.nranks);
    sendReply(in.sock.fd(), in.challenge,
              Status(ridgeInvalidArgument,
                     format("%s: the hello from %s does not authenticate with this rendezvous's key (nonce): "
                            "it was started with the unique id or RIDGE_JOB_KEY of another job",
                            who_.c_str(), fromText.c_str())),
              nullptr, deadline, fromText);
    return;
  }
  Socket s = std::move(in.sock);
  const SocketAddress from = in.from;
  if (failed_) {
    sendReply(s.fd(), in.challenge, failure_, nullptr, deadline, fromText);
    return;
  }
  // From here on the sender knows the key: its mistakes are the job's and fail it.
  int rank = hello.rank, nranks = hello.nranks;
  std::string rankText = format("rank %d (%s)", rank, fromText.c_str());
  auto refuseAndFail = [&](const Status& e) {
    sendReply(s.fd(), in.challenge, e, nullptr, deadline, rankText);
    fail(e, deadline);
  };
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    return refuseAndFail(makeError(ridgeInvalidArgument, "%s: %s reported rank %d of %d ranks, which is out of range",
                                   who_.c_str(), rankText.c_str(), rank, nranks));
  if (nranks_ < 0) {
    nranks_ = nranks;
    members_.resize(static_cast<size_t>(nranks));
  } else if (nranks != nranks_) {
    return refuseAndFail(makeError(
        ridgeInvalidArgument,
        "%s: world size mismatch: %s says there are %d ranks but the first rank to arrive "
        "said %d: every rank must pass the same nranks (world size)",
        who_.c_str(), rankText.c_str(), nranks, nranks_));
  }
  SocketAddress listen;
  if (!fromWire(hello.listen, &listen))
    return refuseAndFail(makeError(ridgeInvalidArgument, "%s: %s reported a malformed listening address",
                                   who_.c_str(), rankText.c_str()));
  if (members_[rank].sock.valid())
    return refuseAndFail(
        makeError(ridgeInvalidArgument,
                  "%s: rank %d arrived twice (from %s and from %s): every rank must appear once", who_.c_str(),
                  rank, members_[rank].from.toString().c_str(), fromText.c_str()));
  members_[rank].sock = std::move(s);
  members_[rank].listen = listen;
  members_[rank].from = from;
  members_[rank].challenge = in.challenge;
  ++arrived_;
  RIDGE_TRACE("%s: rank %d of %d arrived from %s (listening on %s)", who_.c_str(), rank, nranks_,
              fromText.c_str(), listen.toString().c_str());
  if (arrived_ < nranks_) return;

  std::vector<WireAddr> table(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) table[r] = toWire(members_[r].listen);
  for (int r = 0; r < nranks_; ++r) {
    sendReply(members_[r].sock.fd(), members_[r].challenge, Status::ok(), &table, deadline, format("rank %d", r));
    members_[r].sock.reset();
  }
  RIDGE_INFO("%s: all %d ranks arrived, address table sent", who_.c_str(), nranks_);
  done_ = true;
}

bool RootService::progressIncoming(Incoming& in, const Deadline& deadline) {
  size_t n = 0;
  // Not recvSome's message: a connection that closes before its hello is dropped quietly
  // here, counted with the other drops.
  ssize_t got = ::recv(in.sock.fd(), in.buf + in.got, sizeof in.buf - in.got, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  if (got <= 0) {
    drops_.drop("dropping a connection from %s: it closed after %zu bytes, before a complete hello",
                in.from.toString().c_str(), in.got);
    return true;
  }
  n = static_cast<size_t>(got);
  size_t before = in.got;
  in.got += n;
  if (before < sizeof(MsgHeader) && in.got >= sizeof(MsgHeader)) {
    MsgHeader h;
    std::memcpy(&h, in.buf, sizeof h);
    if (h.magic != kMsgMagic || h.tag != kTagHello || h.length != sizeof(Hello)) {
      drops_.drop("dropping a connection from %s: not a Ridge bootstrap hello (magic 0x%08x, tag 0x%08x, length %llu)",
                  in.from.toString().c_str(), h.magic, h.tag, (unsigned long long)h.length);
      return true;
    }
  }
  if (in.got < sizeof in.buf) return false;
  Hello hello;
  std::memcpy(&hello, in.buf + sizeof(MsgHeader), sizeof hello);
  handleHello(in, hello, deadline);
  return true;
}

void RootService::acceptPending() {
  // Accept everything queued (bounded: the backlog is finite and each accept dequeues one).
  for (int k = 0; k < 256; ++k) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listener_.fd(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (acceptResourceError(err)) {
        // Out of descriptors (perhaps held by silent connections): free the oldest pending
        // one and leave the listener alone for a moment instead of spinning on it.
        acceptErrors_.note(who_, err,
                           incoming_.empty() ? "nothing to drop" : "dropping the oldest connection without a hello");
        if (!incoming_.empty()) incoming_.pop_front();
        acceptPausedUntil_ = std::chrono::steady_clock::now() + kAcceptBackoff;
      }
      return;  // EAGAIN, ECONNABORTED, EINTR, ...: next slice
    }
    Socket s(fd);
    if (!configureSocket(fd).isOk()) continue;
    Incoming in;
    in.sock = std::move(s);
    in.from = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
    in.giveUpAt = std::chrono::steady_clock::now() + kHandshakeWait;
    in.challenge = randomNonce();
    MsgHeader h{kMsgMagic, kTagChallenge, sizeof(Challenge)};
    Challenge c{kChallengeMagic, kProtocolVersion, in.challenge};
    char msg[sizeof h + sizeof c];
    std::memcpy(msg, &h, sizeof h);
    std::memcpy(msg + sizeof h, &c, sizeof c);
    // 32 bytes into a fresh socket's empty send buffer: all or nothing in practice.
    ssize_t sent = ::send(fd, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent != static_cast<ssize_t>(sizeof msg)) {
      drops_.drop("dropping a connection from %s: could not send it a challenge", in.from.toString().c_str());
      continue;
    }
    if (incoming_.size() >= kMaxPendingConnections) {
      drops_.drop("dropping a connection from %s: %zu connections are waiting for their hello already",
                  incoming_.front().from.toString().c_str(), incoming_.size());
      incoming_.pop_front();
    }
    incoming_.push_back(std::move(in));
  }
}

void RootService::run() {
  Deadline deadline = Deadline::after(timeoutSec_, nullptr);
  std::vector<pollfd> fds;
  std::vector<int> fdRank;  // >= 0: registered rank; -1: listener; -2 - i: incoming_[i]
  while (!done_) {
    if (deadline.expired()) {
      if (!failed_) {
        Status e =
            nranks_ < 0
                ? makeError(ridgeTimeout, "%s: gave up after %d s: no rank arrived", who_.c_str(),
                            timeoutSec_)
                : makeError(ridgeTimeout, "%s: gave up after %d s: %d of %d ranks arrived (missing: %s)",
                            who_.c_str(), timeoutSec_, arrived_, nranks_, missingRanks().c_str());
        Deadline replyDeadline = Deadline::after(1, nullptr);
        fail(e, replyDeadline);
      }
      break;
    }
    // Drop connections that stayed silent too long (each has its own deadline).
    auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < incoming_.size();) {
      if (now >= incoming_[i].giveUpAt) {
        drops_.drop("dropping a connection from %s: no hello within %lld ms",
                    incoming_[i].from.toString().c_str(), (long long)kHandshakeWait.count());
        incoming_.erase(incoming_.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
    fds.clear();
    fdRank.clear();
    const bool listening = now >= acceptPausedUntil_;
    fds.push_back({listening ? listener_.fd() : -1, POLLIN, 0});  // fd -1: poll ignores it
    fdRank.push_back(-1);
    for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
      if (!members_[r].sock.valid()) continue;
      fds.push_back({members_[r].sock.fd(), POLLIN, 0});
      fdRank.push_back(r);
    }
    for (size_t i = 0; i < incoming_.size(); ++i) {
      fds.push_back({incoming_[i].sock.fd(), POLLIN, 0});
      fdRank.push_back(-2 - static_cast<int>(i));
    }
    int ready = 0;
    Status st = pollSlice(fds.data(), fds.size(), deadline, &ready);
    if (!st.isOk()) {
      RIDGE_WARN("%s: stopping: %s", who_.c_str(), st.message().c_str());
      break;
    }
    if (ready == 0) continue;
    // A registered rank must stay silent until the table comes: data or EOF means it left
    // (typically its own timeout or abort). Free its slot: a restarted rank may take it.
    for (size_t i = 1; i < fds.size(); ++i) {
      int r = fdRank[i];
      if (r < 0 || !fds[i].revents || !members_[r].sock.valid()) continue;
      RIDGE_WARN(
          "%s: rank %d (%s) left before all %d ranks arrived (%d had); waiting for a rank %d to come back",
          who_.c_str(), r, members_[r].from.toString().c_str(), nranks_, arrived_, r);
      members_[r].sock.reset();
      --arrived_;
    }
    // Hellos in progress (done in reverse so erasing keeps the other indices valid).
    std::vector<size_t> finished;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fdRank[i] > -2 || !fds[i].revents) continue;
      size_t idx = static_cast<size_t>(-2 - fdRank[i]);
      if (progressIncoming(incoming_[idx], deadline)) finished.push_back(idx);
      if (done_) break;
    }
    std::sort(finished.rbegin(), finished.rend());
    for (size_t idx : finished) incoming_.erase(incoming_.begin() + static_cast<long>(idx));
    if (done_) break;
    if (listening && (fds[0].revents & POLLIN)) acceptPending();
  }
  listener_.reset();
  incoming_.clear();
  for (auto& m : members_) m.sock.reset();
}

}  // namespace

int activeRootServices() {
  return gActiveRootServices.load();
}

// ---- Unique id ---------------------------------------------------------------------------

void encodeUniqueId(const SocketAddress& root, uint64_t nonce, ridgeUniqueId* out) {
  std::memset(out->internal, 0, sizeof out->internal);
  char* p = out->internal;
  uint32_t magic = kUniqueIdMagic;
  uint16_t version = kUniqueIdVersion;
  uint16_t family = static_cast<uint16_t>(root.family());
  uint32_t len = root.length;
  std::memcpy(p + 0, &magic, 4);
  std::memcpy(p + 4, &version, 2);
  std::memcpy(p + 6, &family, 2);
  std::memcpy(p + 8, &nonce, 8);
  std::memcpy(p + 16, &len, 4);
  std::memcpy(p + 20, &root.storage, std::min<size_t>(len, 28));
  uint32_t sum = fnv1a32(p, 124);
  std::memcpy(p + 124, &sum, 4);
}

Status decodeUniqueId(const ridgeUniqueId& id, UniqueIdInfo* out) {
  const char* p = id.internal;
  uint32_t magic, len, sum;
  uint16_t version, family;
  uint64_t nonce;
  std::memcpy(&magic, p + 0, 4);
  std::memcpy(&version, p + 4, 2);
  std::memcpy(&family, p + 6, 2);
  std::memcpy(&nonce, p + 8, 8);
  std::memcpy(&len, p + 16, 4);
  std::memcpy(&sum, p + 124, 4);
  if (magic != kUniqueIdMagic)
    return makeError(ridgeInvalidArgument,
                     "bootstrap: malformed unique id: magic 0x%08x, expected 0x%08x (pass the id that "
                     "ridgeGetUniqueId wrote, copied unchanged to every rank)",
                     magic, kUniqueIdMagic);
  if (version != kUniqueIdVersion)
    return makeError(ridgeInvalidArgument,
                     "bootstrap: unique id has layout version %u, this library reads %u", version,
                     kUniqueIdVersion);
  if (sum != fnv1a32(p, 124))
    return makeError(ridgeInvalidArgument,
                     "bootstrap: malformed unique id: checksum mismatch (corrupted in transit?)");
  if ((family != AF_INET && family != AF_INET6) || len > 28)
    return makeError(ridgeInvalidArgument, "bootstrap: malformed unique id: address family %u, length %u",
                     family, len);
  SocketAddress a = SocketAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(p + 20), len);
  if (!a.valid() || a.family() != family || a.port() == 0)
    return makeError(ridgeInvalidArgument,
                     "bootstrap: malformed unique id: bad root address (family %u, length %u)", family, len);
  out->root = a;
  out->nonce = nonce;
  return Status::ok();
}

uint64_t randomNonce() {
  uint64_t v = 0;
  ssize_t n;
  do {
    n = getrandom(&v, sizeof v, 0);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof v)) {
    std::random_device rd;
    v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (static_cast<uint64_t>(getpid()) << 17);
  }
  return v ? v : 0x9E3779B97F4A7C15ull;
}

Status startRootServiceOn(const SocketAddress& bindAddr, uint64_t nonce, SocketAddress* bound,
                          int timeoutSec) {
  if (timeoutSec <= 0)
    timeoutSec = static_cast<int>(std::clamp<int64_t>(settingInt(Setting::TIMEOUT), 1, 1 << 24));
  Socket listener;
  SocketAddress actual;
  RIDGE_TRY(listenOn(bindAddr, &listener, &actual));
  auto svc = std::make_unique<RootService>(std::move(listener), actual, nonce, timeoutSec);
  gActiveRootServices.fetch_add(1);
  try {
    std::thread([svc = std::move(svc)]() mutable {
      svc->run();
      svc.reset();
      gActiveRootServices.fetch_sub(1);
    }).detach();
  } catch (const std::system_error& e) {
    gActiveRootServices.fetch_sub(1);
    return makeError(ridgeSystemError, "bootstrap: cannot start the root service thread: %s", e.what());
  }
  RIDGE_INFO("bootstrap: root service listening on %s (gives up after %d s)", actual.toString().c_str(),
             timeoutSec);
  if (bound) *bound = actual;
  return Status::ok();
}

Status startRootService(const std::string& hostPort, uint64_t nonce) {
  SocketAddress addr;
  RIDGE_TRY(parseHostPort(hostPort, &addr));
  return startRootServiceOn(addr, nonce, nullptr);
}

Status uniqueIdFromAddress(const std::string& hostPort, uint64_t nonce, ridgeUniqueId* out) {
  if (!out) return makeError(ridgeInvalidArgument, "bootstrap: uniqueIdFromAddress: out is NULL");
  SocketAddress addr;
  RIDGE_TRY(parseHostPort(hostPort, &addr));
  if (addr.port() == 0)
    return makeError(ridgeInvalidArgument, "bootstrap: root address '%s' needs a non-zero port",
                     hostPort.c_str());
  encodeUniqueId(addr, nonce, out);
  return Status::ok();
}

Status createUniqueId(ridgeUniqueId* out) {
  if (!out) return makeError(ridgeInvalidArgument, "bootstrap: createUniqueId: out is NULL");
  SocketAddress addr;
  std::string ifName;
  RIDGE_TRY(selectInterface(AF_UNSPEC, &addr, &ifName));
  addr.setPort(0);
  uint64_t nonce = randomNonce();
  SocketAddress bound;
  RIDGE_TRY(startRootServiceOn(addr, nonce, &bound));
  RIDGE_INFO("bootstrap: unique id names root %s on interface %s", bound.toString().c_str(), ifName.c_str());
  encodeUniqueId(bound, nonce, out);
  return Status::ok();
}

// ---- Bootstrap ---------------------------------------------------------------------------

Bootstrap::~Bootstrap() {
  close();
}

void Bootstrap::close() {
  closed_ = true;
  listen_.reset();
  ringNext_.reset();
  ringPrev_.reset();
  for (auto& s : sendConn_) s.reset();
  for (auto& s : recvConn_) s.reset();
  for (auto& q : pending_) q.clear();
  std::fill(pendingBytes_.begin(), pendingBytes_.end(), 0);
  incoming_.clear();
}

std::string Bootstrap::peerName(int peer) const {
  if (peer >= 0 && peer < static_cast<int>(peers_.size()))
    return format("bootstrap: rank %d: peer %d at %s", rank_, peer, peers_[peer].toString().c_str());
  return format("bootstrap: rank %d: peer %d", rank_, peer);
}

Status Bootstrap::checkOpen(const char* op) const {
  if (closed_) return makeError(ridgeInvalidUsage, "bootstrap: rank %d: %s after close()", rank_, op);
  return Status::ok();
}

namespace {

// Connects to the root and reads its challenge. A connection the root closes (or leaves
// silent) before the challenge is retried until the deadline: the root may have evicted it
// while strangers flooded it.
Status connectToRoot(const UniqueIdInfo& info, const Deadline& d, const std::string& rootWho, Socket* out,
                     uint64_t* challenge) {
  int backoffMs = 10;
  for (int attempt = 1;; ++attempt) {
    Socket s;
    RIDGE_TRY(connectWithRetry(info.root, d, rootWho, &s));
    MsgHeader h{};
    Challenge c{};
    const Deadline hd = d.capped(kHandshakeWait);
    Status st = recvAll(s.fd(), &h, sizeof h, hd, rootWho + ": waiting for the root's challenge");
    if (st.isOk() && (h.magic != kMsgMagic || h.tag != kTagChallenge || h.length != sizeof c))
      return makeError(ridgeRemoteError,
                       "%s: the listener there is not a Ridge bootstrap root of this version (it sent magic "
                       "0x%08x, tag 0x%08x, length %llu instead of a challenge)",
                       rootWho.c_str(), h.magic, h.tag, (unsigned long long)h.length);
    if (st.isOk()) st = recvAll(s.fd(), &c, sizeof c, hd, rootWho + ": waiting for the root's challenge");
    if (st.isOk()) {
      if (c.magic != kChallengeMagic || c.version != kProtocolVersion)
        return makeError(ridgeInvalidArgument,
                         "%s: the root speaks bootstrap protocol version %u, this rank speaks %u (mixed Ridge "
                         "versions in one job?)",
                         rootWho.c_str(), c.version, kProtocolVersion);
      *out = std::move(s);
      *challenge = c.challenge;
      return Status::ok();
    }
    if (st.code() == ridgeAborted) return st;
    RIDGE_TRY(d.check(format("%s: no challenge from the root after %d attempts (last: %s)", rootWho.c_str(),
                             attempt, st.message().c_str())));
    RIDGE_INFO("%s: %s; connecting again", rootWho.c_str(), st.message().c_str());
    auto wakeAt = std::chrono::steady_clock::now() + std::chrono::milliseconds(backoffMs);
    while (std::chrono::steady_clock::now() < wakeAt && !d.expired() && !d.aborted())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    backoffMs = std::min(backoffMs * 2, 200);
  }
}

}  // namespace

Status Bootstrap::connect(const ridgeUniqueId& id, int rank, int nranks, int timeoutSec,
                          const std::atomic<bool>* abortFlag, std::unique_ptr<Bootstrap>* out) {
  if (!out) return makeError(ridgeInvalidArgument, "bootstrap: connect: out is NULL");
  UniqueIdInfo info;
  RIDGE_TRY(decodeUniqueId(id, &info));
  if (nranks < 1 || nranks > kMaxRanks)
    return makeError(ridgeInvalidArgument, "bootstrap: nranks %d is out of range 1..%d", nranks, kMaxRanks);
  if (rank < 0 || rank >= nranks)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d is out of range 0..%d", rank, nranks - 1);
  if (timeoutSec <= 0)
    timeoutSec = static_cast<int>(std::clamp<int64_t>(settingInt(Setting::TIMEOUT), 1, 1 << 24));

  std::unique_ptr<Bootstrap> b(new Bootstrap);
  b->rank_ = rank;
  b->nranks_ = nranks;
  b->timeoutSec_ = timeoutSec;
  b->abortFlag_ = abortFlag;
  Deadline d = Deadline::after(timeoutSec, abortFlag);
  const auth::Key key = auth::keyFromSecret(info.nonce);

  // Our own listening socket: loopback when the root is on loopback (all ranks are on
  // this host), else the interface RIDGE_SOCKET_IFNAME picks.
  SocketAddress listenAddr;
  if (info.root.isLoopback()) {
    listenAddr = SocketAddress::loopback(info.root.family());
  } else {
    std::string ifName;
    RIDGE_TRY(selectInterface(info.root.family(), &listenAddr, &ifName));
  }
  listenAddr.setPort(0);
  SocketAddress myAddr;
  RIDGE_TRY(listenOn(listenAddr, &b->listen_, &myAddr));
  initStage(InitStage::BootstrapListening, &myAddr);

  // Prove the key on the root's challenge, report, and wait for the table.
  std::string rootWho = format("bootstrap: rank %d: root at %s", rank, info.root.toString().c_str());
  Socket root;
  uint64_t challenge = 0;
  RIDGE_TRY(connectToRoot(info, d, rootWho, &root, &challenge));
  Hello hello{kHelloMagic, kProtocolVersion, 0, rank, nranks, toWire(myAddr)};
  hello.mac = helloMac(key, challenge, hello);
  MsgHeader h{kMsgMagic, kTagHello, sizeof hello};
  iovec iov[2] = {{&h, sizeof h}, {&hello, sizeof hello}};
  RIDGE_TRY(sendAllv(root.fd(), iov, 2, d, rootWho));
  initStage(InitStage::BootstrapHelloSent);

  RIDGE_TRY(waitFd(root.fd(), POLLIN, d,
                   format("bootstrap: rank %d: waiting at the root %s for all %d ranks to arrive (is every "
                          "rank started, with the same id?)",
                          rank, info.root.toString().c_str(), nranks)));
  MsgHeader rh{};
  RIDGE_TRY(recvAll(root.fd(), &rh, sizeof rh, d, rootWho));
  uint64_t tableBytes = static_cast<uint64_t>(nranks) * sizeof(WireAddr);
  if (rh.magic != kMsgMagic || rh.tag != kTagReply || rh.length < sizeof(ReplyHead) ||
      rh.length > sizeof(ReplyHead) + tableBytes)
    return makeError(ridgeRemoteError, "%s sent a malformed reply (magic 0x%08x, tag 0x%08x, length %llu)",
                     rootWho.c_str(), rh.magic, rh.tag, (unsigned long long)rh.length);
  ReplyHead head{};
  RIDGE_TRY(recvAll(root.fd(), &head, sizeof head, d, rootWho));
  head.message[sizeof head.message - 1] = '\0';
  if (head.code != 0) {
    ridgeResult_t code =
        validResultCode(head.code) ? static_cast<ridgeResult_t>(head.code) : ridgeRemoteError;
    const bool authentic = head.mac == replyMac(key, challenge, head, nullptr, 0);
    return makeError(code, "bootstrap: rank %d: the root at %s refused the rendezvous: %s%s", rank,
                     info.root.toString().c_str(), head.message,
                     authentic ? "" : " (the refusal does not carry this rank's key either)");
  }
  if (head.nranks != nranks || rh.length != sizeof(ReplyHead) + tableBytes)
    return makeError(ridgeRemoteError, "%s sent a table of %d ranks (%llu bytes), expected %d",
                     rootWho.c_str(), head.nranks, (unsigned long long)rh.length, nranks);
  std::vector<WireAddr> table(static_cast<size_t>(nranks));
  RIDGE_TRY(recvAll(root.fd(), table.data(), tableBytes, d, rootWho));
  root.reset();
  if (head.mac != replyMac(key, challenge, head, table.data(), tableBytes))
    return makeError(ridgeRemoteError,
                     "%s sent an address table that does not authenticate with this job's key: not the root "
                     "this rank's id names",
                     rootWho.c_str());
  b->nonce_ = head.session;
  b->peers_.resize(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r)
    if (!fromWire(table[r], &b->peers_[r]))
      return makeError(ridgeRemoteError, "%s sent a malformed address for rank %d", rootWho.c_str(), r);
  initStage(InitStage::BootstrapTableReceived);

  b->sendConn_.resize(static_cast<size_t>(nranks));
  b->recvConn_.resize(static_cast<size_t>(nranks));
  b->pending_.resize(static_cast<size_t>(nranks));
  b->pendingBytes_.assign(static_cast<size_t>(nranks), 0);

  if (nranks > 1) {
    int next = (rank + 1) % nranks;
    int prev = (rank - 1 + nranks) % nranks;
    // Connecting first cannot deadlock: the peer's listening socket already exists and
    // the kernel completes the handshake before the peer calls accept().
    RIDGE_TRY(b->connectTo(next, kKindRing, d, &b->ringNext_));
    Bootstrap* self = b.get();
    RIDGE_TRY(b->acceptUntil(d, format("the ring connection from rank %d", prev).c_str(),
                             [self] { return self->ringPrev_.valid(); }));
  }
  initStage(InitStage::BootstrapRingConnected);
  RIDGE_INFO("bootstrap: rank %d of %d connected (listening on %s)", rank, nranks, myAddr.toString().c_str());
  *out = std::move(b);
  return Status::ok();
}

Status Bootstrap::connectTo(int peer, uint32_t kind, const Deadline& d, Socket* out) {
  std::string who = peerName(peer);
  Socket s;
  RIDGE_TRY(connectWithRetry(peers_[peer], d, who, &s));
  Handshake hs{kHandshakeMagic, kind, nonce_, rank_, peer};
  MsgHeader h{kMsgMagic, kind, sizeof hs};
  iovec iov[2] = {{&h, sizeof h}, {&hs, sizeof hs}};
  RIDGE_TRY(sendAllv(s.fd(), iov, 2, d, who));
  *out = std::move(s);
  return Status::ok();
}

void Bootstrap::placeHandshake(Incoming& in) {
  const std::string fromText =
      format("bootstrap: rank %d: incoming connection from %s", rank_, in.from.toString().c_str());
  MsgHeader h;
  Handshake hs;
  std::memcpy(&h, in.buf, sizeof h);
  std::memcpy(&hs, in.buf + sizeof h, sizeof hs);
  if (hs.magic != kHandshakeMagic || hs.nonce != nonce_) {
    RIDGE_WARN("%s: wrong handshake (magic 0x%08x, session nonce %016llx): a rank of another job, or forged? "
               "dropped",
               fromText.c_str(), hs.magic, (unsigned long long)hs.nonce);
    return;
  }
  int fromRank = hs.fromRank;
  if (fromRank < 0 || fromRank >= nranks_ || hs.toRank != rank_) {
    RIDGE_WARN("%s: handshake names rank %d -> %d, which does not fit %d ranks / rank %d; dropped",
               fromText.c_str(), hs.fromRank, hs.toRank, nranks_, rank_);
    return;
  }
  if (hs.kind == kKindRing) {
    int prev = (rank_ - 1 + nranks_) % nranks_;
    if (fromRank != prev || ringPrev_.valid()) {
      RIDGE_WARN("%s: unexpected ring connection from rank %d; dropped", fromText.c_str(), fromRank);
      return;
    }
    ringPrev_ = std::move(in.sock);
  } else if (hs.kind == kKindP2P) {
    if (recvConn_[fromRank].valid()) {
      RIDGE_WARN("%s: second point-to-point connection from rank %d; dropped", fromText.c_str(), fromRank);
      return;
    }
    recvConn_[fromRank] = std::move(in.sock);
  } else {
    RIDGE_WARN("%s: unknown connection kind %u; dropped", fromText.c_str(), hs.kind);
  }
}

Status Bootstrap::serveListener(const Deadline& d, const std::string& who) {
  using Clock = std::chrono::steady_clock;
  // Connections whose handshake is late are dropped, each on its own deadline, so that
  // silent strangers never hold up the ranks behind them.
  const auto now = Clock::now();
  for (size_t i = 0; i < incoming_.size();) {
    if (now >= incoming_[i].giveUpAt) {
      RIDGE_WARN("bootstrap: rank %d: dropping a connection from %s: no handshake within %lld ms", rank_,
                 incoming_[i].from.toString().c_str(), (long long)kHandshakeWait.count());
      incoming_.erase(incoming_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  std::vector<pollfd> fds;
  const bool listening = now >= acceptPausedUntil_;
  fds.push_back({listening ? listen_.fd() : -1, POLLIN, 0});
  for (const Incoming& in : incoming_) fds.push_back({in.sock.fd(), POLLIN, 0});
  int ready = 0;
  RIDGE_TRY(pollSlice(fds.data(), fds.size(), d, &ready));
  if (ready == 0) return Status::ok();
  // Handshakes in progress: read what came; finished ones (placed or dropped) leave the list.
  std::vector<size_t> finished;
  for (size_t i = 1; i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    Incoming& in = incoming_[i - 1];
    ssize_t n = ::recv(in.sock.fd(), in.buf + in.got, sizeof in.buf - in.got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n <= 0) {  // closed before its handshake: ignore it
      finished.push_back(i - 1);
      continue;
    }
    const size_t before = in.got;
    in.got += static_cast<size_t>(n);
    if (before < sizeof(MsgHeader) && in.got >= sizeof(MsgHeader)) {
      MsgHeader h;
      std::memcpy(&h, in.buf, sizeof h);
      if (h.magic != kMsgMagic || h.length != sizeof(Handshake)) {
        RIDGE_WARN("bootstrap: rank %d: incoming connection from %s: not a Ridge bootstrap connection (magic "
                   "0x%08x), dropped",
                   rank_, in.from.toString().c_str(), h.magic);
        finished.push_back(i - 1);
        continue;
      }
    }
    if (in.got < sizeof in.buf) continue;
    placeHandshake(in);
    finished.push_back(i - 1);
  }
  std::sort(finished.rbegin(), finished.rend());
  for (size_t idx : finished) incoming_.erase(incoming_.begin() + static_cast<long>(idx));
  if (!listening || !(fds[0].revents & POLLIN)) return Status::ok();
  for (int k = 0; k < 64; ++k) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listen_.fd(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (acceptResourceError(err)) {
        acceptErrors_.note(who, err,
                           incoming_.empty() ? "nothing to drop"
                                             : "dropping the oldest connection without a handshake");
        if (!incoming_.empty()) incoming_.erase(incoming_.begin());
        acceptPausedUntil_ = Clock::now() + kAcceptBackoff;
      }
      break;
    }
    Socket s(fd);
    if (!configureSocket(fd).isOk()) continue;
    if (incoming_.size() >= kMaxPendingConnections) {
      RIDGE_WARN("bootstrap: rank %d: %zu connections without a handshake; dropping the oldest (from %s)", rank_,
                 incoming_.size(), incoming_.front().from.toString().c_str());
      incoming_.erase(incoming_.begin());
    }
    Incoming in;
    in.sock = std::move(s);
    in.from = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
    in.giveUpAt = Clock::now() + kHandshakeWait;
    incoming_.push_back(std::move(in));
  }
  return Status::ok();
}

template <typename Pred>
Status Bootstrap::acceptUntil(const Deadline& d, const char* waitingFor, Pred ready) {
  // Every round polls the listener and all handshakes in progress at once, for at most one
  // poll slice; the deadline bounds the rounds.
  const std::string who = format("bootstrap: rank %d: waiting for %s", rank_, waitingFor);
  while (!ready()) {
    RIDGE_TRY(d.check(who));
    RIDGE_TRY(serveListener(d, who));
  }
  return Status::ok();
}

namespace {
const char* tagName(uint32_t tag) {
  switch (tag) {
    case kTagAllGather: return "allGather";
    case kTagBarrier: return "barrier";
    case kTagBroadcast: return "broadcast";
    default: return "point-to-point";
  }
}
}  // namespace

Status Bootstrap::exchange(int sendFd, int sendPeer, uint32_t tag, const void* sendData, size_t sendBytes,
                           int recvFd, int recvPeer, void* recvData, size_t recvBytes, const Deadline& d) {
  MsgHeader sh{kMsgMagic, tag, sendBytes};
  MsgHeader rh{};
  const size_t sendTotal = sizeof sh + sendBytes;
  const size_t recvTotal = sizeof rh + recvBytes;
  size_t sent = sendFd >= 0 ? 0 : sendTotal;
  size_t got = recvFd >= 0 ? 0 : recvTotal;
  std::string sendWho = sendFd >= 0 ? peerName(sendPeer) : std::string();
  std::string recvWho = recvFd >= 0 ? peerName(recvPeer) : std::string();

  while (sent < sendTotal || got < recvTotal) {
    bool progress = false;
    if (sent < sendTotal) {
      iovec iov[2];
      int cnt = 0;
      if (sent < sizeof sh) {
        iov[cnt++] = {reinterpret_cast<char*>(&sh) + sent, sizeof sh - sent};
        iov[cnt++] = {const_cast<void*>(sendData), sendBytes};
      } else {
        iov[cnt++] = {const_cast<char*>(static_cast<const char*>(sendData)) + (sent - sizeof sh),
                      sendTotal - sent};
      }
      size_t n = 0;
      RIDGE_TRY(sendSome(sendFd, iov, cnt, &n, sendWho));
      sent += n;
      progress |= n > 0;
    }
    if (got < recvTotal) {
      size_t n = 0;
      if (got < sizeof rh) {
        RIDGE_TRY(recvSome(recvFd, reinterpret_cast<char*>(&rh) + got, sizeof rh - got, &n, recvWho));
        got += n;
        if (got == sizeof rh) {
          if (rh.magic != kMsgMagic)
            return makeError(ridgeRemoteError, "%s sent a malformed message (magic 0x%08x, expected 0x%08x)",
                             recvWho.c_str(), rh.magic, kMsgMagic);
          if (rh.tag != tag)
            return makeError(ridgeInvalidUsage,
                             "%s: expected a %s message but the peer sent a %s message (tag 0x%08x): ranks "
                             "are calling different bootstrap collectives",
                             recvWho.c_str(), tagName(tag), tagName(rh.tag), rh.tag);
          if (rh.length != recvBytes)
            return makeError(ridgeInvalidUsage,
                             "%s: %s expected %zu bytes but the peer sent %llu: ranks disagree on the size",
                             recvWho.c_str(), tagName(tag), recvBytes, (unsigned long long)rh.length);
        }
      } else {
        RIDGE_TRY(
            recvSome(recvFd, static_cast<char*>(recvData) + (got - sizeof rh), recvTotal - got, &n, recvWho));
        got += n;
      }
      progress |= n > 0;
    }
    if (progress) continue;
    if (sent >= sendTotal && got >= recvTotal) break;
    pollfd fds[2];
    nfds_t cnt = 0;
    if (sent < sendTotal) fds[cnt++] = {sendFd, POLLOUT, 0};
    if (got < recvTotal) fds[cnt++] = {recvFd, POLLIN, 0};
    if (d.expired() || d.aborted())
      return d.check(
          format("bootstrap: rank %d: %s (sent %zu of %zu bytes to rank %d, received %zu of %zu "
                 "bytes from rank %d)",
                 rank_, tagName(tag), sent, sendTotal, sendPeer, got, recvTotal, recvPeer));
    int ready = 0;
    RIDGE_TRY(pollSlice(fds, cnt, d, &ready));
  }
  return Status::ok();
}

Status Bootstrap::ringAllGather(void* data, size_t bytesPerRank, uint32_t tag) {
  if (nranks_ == 1) return Status::ok();
  Deadline d = deadline();
  char* base = static_cast<char*>(data);
  int next = (rank_ + 1) % nranks_;
  int prev = (rank_ - 1 + nranks_) % nranks_;
  for (int step = 0; step < nranks_ - 1; ++step) {
    int sendBlock = (rank_ - step + nranks_) % nranks_;
    int recvBlock = (rank_ - step - 1 + nranks_) % nranks_;
    RIDGE_TRY(exchange(ringNext_.fd(), next, tag, base ? base + sendBlock * bytesPerRank : nullptr,
                       bytesPerRank, ringPrev_.fd(), prev, base ? base + recvBlock * bytesPerRank : nullptr,
                       bytesPerRank, d));
  }
  return Status::ok();
}

Status Bootstrap::allGather(void* data, size_t bytesPerRank) {
  RIDGE_TRY(checkOpen("allGather"));
  if (!data && bytesPerRank > 0)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d: allGather: data is NULL", rank_);
  if (bytesPerRank > kMaxMessageBytes)
    return makeError(ridgeInvalidArgument,
                     "bootstrap: rank %d: allGather: %zu bytes per rank exceeds the limit %llu", rank_,
                     bytesPerRank, (unsigned long long)kMaxMessageBytes);
  return ringAllGather(data, bytesPerRank, kTagAllGather);
}

Status Bootstrap::barrier() {
  RIDGE_TRY(checkOpen("barrier"));
  return ringAllGather(nullptr, 0, kTagBarrier);
}

Status Bootstrap::broadcast(void* data, size_t bytes, int root) {
  RIDGE_TRY(checkOpen("broadcast"));
  if (root < 0 || root >= nranks_)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d: broadcast root %d is out of range 0..%d",
                     rank_, root, nranks_ - 1);
  if (!data && bytes > 0)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d: broadcast: data is NULL", rank_);
  if (bytes > kMaxMessageBytes)
    return makeError(ridgeInvalidArgument,
                     "bootstrap: rank %d: broadcast of %zu bytes exceeds the limit %llu", rank_, bytes,
                     (unsigned long long)kMaxMessageBytes);
  if (nranks_ == 1) return Status::ok();
  Deadline d = deadline();
  int next = (rank_ + 1) % nranks_;
  int prev = (rank_ - 1 + nranks_) % nranks_;
  // Pass along the ring from the root; the rank before the root does not forward.
  if (rank_ != root)
    RIDGE_TRY(exchange(-1, -1, kTagBroadcast, nullptr, 0, ringPrev_.fd(), prev, data, bytes, d));
  if (next != root)
    RIDGE_TRY(exchange(ringNext_.fd(), next, kTagBroadcast, data, bytes, -1, -1, nullptr, 0, d));
  return Status::ok();
}

Status Bootstrap::send(int peer, uint32_t tag, const void* data, size_t bytes) {
  RIDGE_TRY(checkOpen("send"));
  if (peer < 0 || peer >= nranks_)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d: send to peer %d, out of range 0..%d", rank_,
                     peer, nranks_ - 1);
  if (!data && bytes > 0)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d: send: data is NULL", rank_);
  if (bytes > kMaxMessageBytes)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d: send of %zu bytes exceeds the limit %llu",
                     rank_, bytes, (unsigned long long)kMaxMessageBytes);
  if (peer == rank_) {
    if (pendingBytes_[peer] + bytes > kMaxBufferedBytes)
      return makeError(ridgeInvalidUsage, "bootstrap: rank %d: too many unreceived messages to itself",
                       rank_);
    const char* p = static_cast<const char*>(data);
    pending_[peer].push_back({tag, std::vector<char>(p, p + bytes)});
    pendingBytes_[peer] += bytes;
    return Status::ok();
  }
  Deadline d = deadline();
  if (!sendConn_[peer].valid()) RIDGE_TRY(connectTo(peer, kKindP2P, d, &sendConn_[peer]));
  MsgHeader h{kMsgMagic, tag, bytes};
  iovec iov[2] = {{&h, sizeof h}, {const_cast<void*>(data), bytes}};
  Status st = sendAllv(sendConn_[peer].fd(), iov, 2, d, peerName(peer));
  if (!st.isOk()) sendConn_[peer].reset();  // the stream is no longer in step
  return st;
}

Status Bootstrap::recv(int peer, uint32_t tag, void* data, size_t bytes, int waitSec) {
  RIDGE_TRY(checkOpen("recv"));
  if (peer < 0 || peer >= nranks_)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d: recv from peer %d, out of range 0..%d", rank_,
                     peer, nranks_ - 1);
  if (!data && bytes > 0)
    return makeError(ridgeInvalidArgument, "bootstrap: rank %d: recv: data is NULL", rank_);

  // A message of this tag that arrived earlier?
  auto& queue = pending_[peer];
  for (auto it = queue.begin(); it != queue.end(); ++it) {
    if (it->tag != tag) continue;
    if (it->data.size() != bytes)
      return makeError(ridgeInvalidUsage, "%s: message with tag %u has %zu bytes, the receiver expected %zu",
                       peerName(peer).c_str(), tag, it->data.size(), bytes);
    if (bytes) std::memcpy(data, it->data.data(), bytes);
    pendingBytes_[peer] -= it->data.size();
    queue.erase(it);
    return Status::ok();
  }
  if (peer == rank_)
    return makeError(ridgeInvalidUsage,
                     "bootstrap: rank %d: recv from itself with tag %u but no such message was sent", rank_,
                     tag);

  Deadline d = waitSec > 0 ? Deadline::after(waitSec, abortFlag_) : deadline();
  std::string who = peerName(peer);
  if (!recvConn_[peer].valid()) {
    Socket* slot = &recvConn_[peer];
    RIDGE_TRY(acceptUntil(d, format("the connection from peer %d (recv, tag %u)", peer, tag).c_str(),
                          [slot] { return slot->valid(); }));
  }
  int fd = recvConn_[peer].fd();
  for (;;) {
    RIDGE_TRY(waitFd(fd, POLLIN, d,
                     format("bootstrap: rank %d: waiting for a message with tag %u from peer %d at %s", rank_,
                            tag, peer, peers_[peer].toString().c_str())));
    MsgHeader h{};
    RIDGE_TRY(recvAll(fd, &h, sizeof h, d, who));
    if (h.magic != kMsgMagic) {
      recvConn_[peer].reset();
      return makeError(ridgeRemoteError, "%s sent a malformed message (magic 0x%08x, expected 0x%08x)",
                       who.c_str(), h.magic, kMsgMagic);
    }
    if (h.length > kMaxMessageBytes) {
      recvConn_[peer].reset();
      return makeError(ridgeRemoteError, "%s sent an oversized message (%llu bytes, limit %llu)", who.c_str(),
                       (unsigned long long)h.length, (unsigned long long)kMaxMessageBytes);
    }
    if (h.tag == tag && h.length == bytes) return recvAll(fd, data, bytes, d, who);
    if (h.tag != tag && pendingBytes_[peer] + h.length > kMaxBufferedBytes) {
      recvConn_[peer].reset();
      return makeError(
          ridgeInvalidUsage,
          "%s: more than %llu bytes of messages with other tags arrived while waiting for tag %u",
          who.c_str(), (unsigned long long)kMaxBufferedBytes, tag);
    }
    std::vector<char> buf(h.length);
    RIDGE_TRY(recvAll(fd, buf.data(), buf.size(), d, who));
    if (h.tag == tag)
      return makeError(ridgeInvalidUsage, "%s: message with tag %u has %llu bytes, the receiver expected %zu",
                       who.c_str(), tag, (unsigned long long)h.length, bytes);
    pendingBytes_[peer] += h.length;
    queue.push_back({h.tag, std::move(buf)});
  }
}

// ---- Host identity -----------------------------------------------------------------------

std::string hostIdentity() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown-host");
  std::string boot;
  {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
    while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  }
  if (boot.empty()) boot = "no-boot-id";
  char ns[128] = {0};
  ssize_t n = readlink("/proc/self/ns/ipc", ns, sizeof ns - 1);
  std::string ipc = n > 0 ? std::string(ns, static_cast<size_t>(n)) : std::string("ipc:?");
  return std::string(host) + "|" + boot + "|" + ipc;
}

uint64_t hostHash() {
  static const uint64_t h = [] {
    std::string id = hostIdentity();
    return fnv1a64(id.data(), id.size());
  }();
  return h;
}

}  // namespace ridge
