#include "bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/settings.h"

namespace ridge {

// ---- SocketAddress ---------------------------------------------------------------------

bool SocketAddress::valid() const {
  if (storage.ss_family == AF_INET) return length == sizeof(sockaddr_in);
  if (storage.ss_family == AF_INET6) return length == sizeof(sockaddr_in6);
  return false;
}

uint16_t SocketAddress::port() const {
  if (storage.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SocketAddress::setPort(uint16_t p) {
  if (storage.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(p);
  if (storage.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(p);
}

bool SocketAddress::isLoopback() const {
  if (storage.ss_family == AF_INET) {
    uint32_t a = ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (storage.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&a)) return a.s6_addr[12] == 127;
  }
  return false;
}

bool SocketAddress::isLinkLocal() const {
  if (storage.ss_family != AF_INET6) return false;
  const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
  return IN6_IS_ADDR_LINKLOCAL(&a);
}

std::string SocketAddress::hostString() const {
  char host[NI_MAXHOST];
  if (!valid()) return "<invalid address>";
  if (getnameinfo(sa(), length, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
    return "<unprintable address>";
  return host;
}

std::string SocketAddress::toString() const {
  if (!valid()) return "<invalid address>";
  std::string host = hostString();
  if (storage.ss_family == AF_INET6) return "[" + host + "]:" + std::to_string(port());
  return host + ":" + std::to_string(port());
}

SocketAddress SocketAddress::fromSockaddr(const sockaddr* sa, socklen_t len) {
  SocketAddress a;
  if (!sa) return a;
  socklen_t want = sa->sa_family == AF_INET    ? sizeof(sockaddr_in)
                   : sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                               : 0;
  if (want == 0 || len < want) return a;
  std::memcpy(&a.storage, sa, want);
  a.length = want;
  return a;
}

SocketAddress SocketAddress::loopback(int family, uint16_t port) {
  SocketAddress a;
  if (family == AF_INET6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a.storage);
    s->sin6_family = AF_INET6;
    s->sin6_addr = in6addr_loopback;
    s->sin6_port = htons(port);
    a.length = sizeof(sockaddr_in6);
  } else {
    auto* s = reinterpret_cast<sockaddr_in*>(&a.storage);
    s->sin_family = AF_INET;
    s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->sin_port = htons(port);
    a.length = sizeof(sockaddr_in);
  }
  return a;
}

bool operator==(const SocketAddress& a, const SocketAddress& b) {
  if (a.family() != b.family() || a.length != b.length) return false;
  if (a.family() == AF_INET) {
    auto* x = reinterpret_cast<const sockaddr_in*>(&a.storage);
    auto* y = reinterpret_cast<const sockaddr_in*>(&b.storage);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a.family() == AF_INET6) {
    auto* x = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    auto* y = reinterpret_cast<const sockaddr_in6*>(&b.storage);
    return x->sin6_port == y->sin6_port && x->sin6_scope_id == y->sin6_scope_id &&
           std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return a.length == 0;
}

// ---- Parsing ---------------------------------------------------------------------------

Status splitHostPort(const std::string& text, std::string* host, uint16_t* port) {
  std::string h, p;
  if (text.empty()) return makeError(ridgeInvalidArgument, "address is empty (expected host:port)");
  if (text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos)
      return makeError(ridgeInvalidArgument, "address '%s': missing ']' after the IPv6 address",
                       text.c_str());
    h = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':')
      return makeError(ridgeInvalidArgument, "address '%s': expected ':port' after ']'", text.c_str());
    p = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos)
      return makeError(ridgeInvalidArgument, "address '%s': missing ':port' (expected host:port)",
                       text.c_str());
    if (text.find(':') != colon)
      return makeError(ridgeInvalidArgument, "address '%s': an IPv6 address needs brackets, e.g. [::1]:29500",
                       text.c_str());
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (h.empty()) return makeError(ridgeInvalidArgument, "address '%s': empty host", text.c_str());
  if (p.empty() || p.size() > 5 ||
      !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return makeError(ridgeInvalidArgument, "address '%s': port '%s' is not a number 0-65535", text.c_str(),
                     p.c_str());
  long v = std::strtol(p.c_str(), nullptr, 10);
  if (v > 65535)
    return makeError(ridgeInvalidArgument, "address '%s': port %ld is out of range 0-65535", text.c_str(), v);
  *host = h;
  *port = static_cast<uint16_t>(v);
  return Status::ok();
}

Status parseHostPort(const std::string& text, SocketAddress* out) {
  std::string host;
  uint16_t port = 0;
  RIDGE_TRY(splitHostPort(text, &host, &port));
  bool bracketed = text[0] == '[';

  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = bracketed ? AF_INET6 : AF_UNSPEC;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 && !bracketed) {
    hints.ai_flags = AI_ADDRCONFIG;
    rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc == EAI_BADFLAGS || rc == EAI_NONAME) {
      hints.ai_flags = 0;
      if (res) freeaddrinfo(res);
      res = nullptr;
      rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
    }
  }
  if (rc != 0 || !res)
    return makeError(ridgeInvalidArgument, "address '%s': cannot resolve host '%s': %s", text.c_str(),
                     host.c_str(), rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc));
  // Prefer IPv4 among the results of a name lookup.
  const addrinfo* pick = nullptr;
  for (const addrinfo* r = res; r; r = r->ai_next)
    if (r->ai_family == AF_INET && !pick) pick = r;
  if (!pick)
    for (const addrinfo* r = res; r; r = r->ai_next)
      if (r->ai_family == AF_INET6 && !pick) pick = r;
  SocketAddress a;
  if (pick) a = SocketAddress::fromSockaddr(pick->ai_addr, pick->ai_addrlen);
  freeaddrinfo(res);
  if (!a.valid())
    return makeError(ridgeInvalidArgument, "address '%s': host '%s' has no IPv4 or IPv6 address",
                     text.c_str(), host.c_str());
  a.setPort(port);
  *out = a;
  return Status::ok();
}

// ---- Interfaces ------------------------------------------------------------------------

std::vector<InterfaceAddress> listInterfaces() {
  std::vector<InterfaceAddress> list;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return list;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || !i->ifa_name) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    InterfaceAddress ia;
    ia.name = i->ifa_name;
    ia.address =
        SocketAddress::fromSockaddr(i->ifa_addr, fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (!ia.address.valid()) continue;
    ia.address.setPort(0);
    ia.up = (i->ifa_flags & IFF_UP) != 0;
    ia.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    list.push_back(ia);
  }
  freeifaddrs(ifs);
  return list;
}

bool interfaceMatches(const std::string& specIn, const std::string& name) {
  std::string spec = specIn;
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') {
    exclude = true;
    spec.erase(0, 1);
  }
  if (!spec.empty() && spec[0] == '=') {
    exact = true;
    spec.erase(0, 1);
  }
  if (spec.empty()) return true;
  bool hit = false;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) {
      if (exact ? name == item : name.compare(0, item.size(), item) == 0) hit = true;
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return exclude ? !hit : hit;
}

Status selectInterface(const std::string& spec, int preferFamily, SocketAddress* out, std::string* ifName) {
  std::vector<InterfaceAddress> all = listInterfaces();
  auto rankOf = [&](const InterfaceAddress& ia) {
    // Lower is better: preferred family, then the other, link-local IPv6 last.
    int r = 0;
    int fam = ia.address.family();
    int want = preferFamily == AF_UNSPEC ? AF_INET : preferFamily;
    if (fam != want) r += 1;
    if (ia.address.isLinkLocal()) r += 2;
    return r;
  };
  auto pickFrom = [&](auto accept) -> const InterfaceAddress* {
    // First interface (in getifaddrs order) that has an accepted address, then its best address.
    std::string chosen;
    for (const auto& ia : all)
      if (ia.up && accept(ia)) {
        chosen = ia.name;
        break;
      }
    if (chosen.empty()) return nullptr;
    const InterfaceAddress* best = nullptr;
    for (const auto& ia : all)
      if (ia.name == chosen && ia.up && accept(ia) && (!best || rankOf(ia) < rankOf(*best))) best = &ia;
    return best;
  };
  const InterfaceAddress* pick = nullptr;
  if (!spec.empty()) {
    pick = pickFrom([&](const InterfaceAddress& ia) { return interfaceMatches(spec, ia.name); });
    if (!pick) {
      std::string names;
      for (const auto& ia : all)
        if (names.find(ia.name) == std::string::npos) {
          if (!names.empty()) names += ", ";
          names += ia.name;
        }
      return makeError(ridgeSystemError,
                       "RIDGE_SOCKET_IFNAME='%s' matches no interface that is up with an IPv4/IPv6 "
                       "address (interfaces: %s)",
                       spec.c_str(), names.empty() ? "none" : names.c_str());
    }
  } else {
    pick = pickFrom([](const InterfaceAddress& ia) { return !ia.loopback && !ia.address.isLinkLocal(); });
    if (!pick) pick = pickFrom([](const InterfaceAddress& ia) { return !ia.loopback; });
    if (!pick) pick = pickFrom([](const InterfaceAddress&) { return true; });
    if (!pick) {
      *out = SocketAddress::loopback(preferFamily == AF_INET6 ? AF_INET6 : AF_INET);
      if (ifName) *ifName = "lo";
      RIDGE_INFO("bootstrap: no network interface found, using %s", out->hostString().c_str());
      return Status::ok();
    }
  }
  *out = pick->address;
  if (ifName) *ifName = pick->name;
  return Status::ok();
}

Status selectInterface(int preferFamily, SocketAddress* out, std::string* ifName) {
  // RIDGE_SOCKET_FAMILY orders the addresses when the caller has no family of its own.
  if (preferFamily == AF_UNSPEC) preferFamily = preferredFamily();
  return selectInterface(settingString(Setting::SOCKET_IFNAME), preferFamily, out, ifName);
}

int preferredFamily() {
  const std::string f = settingString(Setting::SOCKET_FAMILY);
  if (f == "ipv6" || f == "IPV6" || f == "6") return AF_INET6;
  if (f == "ipv4" || f == "IPV4" || f == "4") return AF_INET;
  if (f != "auto" && f != "AUTO" && !f.empty())
    RIDGE_WARN("RIDGE_SOCKET_FAMILY=%s is not auto, ipv4 or ipv6; using auto", f.c_str());
  return AF_UNSPEC;
}

// ---- Deadline --------------------------------------------------------------------------

Deadline Deadline::after(int timeoutSec, const std::atomic<bool>* abortFlag) {
  Deadline d;
  d.timeoutSec = timeoutSec > 0 ? timeoutSec : 1;
  d.abortFlag = abortFlag;
  d.when = std::chrono::steady_clock::now() + std::chrono::seconds(d.timeoutSec);
  return d;
}

Deadline Deadline::capped(std::chrono::milliseconds limit) const {
  Deadline d = *this;
  auto t = std::chrono::steady_clock::now() + limit;
  if (t < d.when) {
    d.when = t;
    d.timeoutSec = static_cast<int>(std::max<int64_t>(1, (limit.count() + 999) / 1000));
  }
  return d;
}

int Deadline::sliceMs() const {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(when - std::chrono::steady_clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left, kPollSliceMs));
}

Status Deadline::check(const std::string& what) const {
  if (aborted()) return makeError(ridgeAborted, "%s: aborted", what.c_str());
  if (expired()) return makeError(ridgeTimeout, "%s: timed out after %d s", what.c_str(), timeoutSec);
  return Status::ok();
}

// ---- Socket ----------------------------------------------------------------------------

void Socket::reset(int fd) {
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);
  fd_ = fd;
}

Status configureSocket(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return systemError("bootstrap: fcntl(O_NONBLOCK)");
  int fdflags = fcntl(fd, F_GETFD, 0);
  if (fdflags >= 0) fcntl(fd, F_SETFD, fdflags | FD_CLOEXEC);
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
    return systemError("bootstrap: setsockopt(TCP_NODELAY)");
  return Status::ok();
}

static int newSocket(int family) {
  return ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
}

Status listenOn(const SocketAddress& addr, Socket* out, SocketAddress* bound) {
  if (!addr.valid()) return makeError(ridgeInvalidArgument, "bootstrap: cannot listen on an invalid address");
  Socket s(newSocket(addr.family()));
  if (!s.valid()) return systemError(format("bootstrap: socket() for %s", addr.toString().c_str()).c_str());
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr.family() == AF_INET6) setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(s.fd(), addr.sa(), addr.length) != 0)
    return systemError(format("bootstrap: bind to %s", addr.toString().c_str()).c_str());
  if (::listen(s.fd(), SOMAXCONN) != 0)
    return systemError(format("bootstrap: listen on %s", addr.toString().c_str()).c_str());
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return systemError("bootstrap: getsockname");
  if (bound) *bound = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
  *out = std::move(s);
  return Status::ok();
}

static bool retryableConnectError(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
         err == ECONNRESET || err == ECONNABORTED || err == EAGAIN || err == EADDRNOTAVAIL;
}

Status connectWithRetry(const SocketAddress& addr, const Deadline& deadline, const std::string& who,
                        Socket* out) {
  if (!addr.valid()) return makeError(ridgeInvalidArgument, "%s: invalid address", who.c_str());
  int backoffMs = 10;
  int attempts = 0;
  int lastErr = 0;
  for (;;) {
    if (deadline.aborted()) return makeError(ridgeAborted, "%s: aborted while connecting", who.c_str());
    if (deadline.expired())
      return makeError(ridgeTimeout, "%s: could not connect within %d s (%d attempts, last error: %s)",
                       who.c_str(), deadline.timeoutSec, attempts, lastErr ? std::strerror(lastErr) : "none");
    ++attempts;
    Socket s(newSocket(addr.family()));
    if (!s.valid()) return systemError(format("%s: socket()", who.c_str()).c_str());
    int err = 0;
    int rc;
    do {
      rc = ::connect(s.fd(), addr.sa(), addr.length);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) err = errno;
    if (rc != 0 && err == EINPROGRESS) {
      err = 0;
      // Wait for the handshake to finish, slice by slice.
      for (;;) {
        pollfd p{s.fd(), POLLOUT, 0};
        int n = ::poll(&p, 1, deadline.sliceMs());
        if (n < 0 && errno != EINTR) return systemError(format("%s: poll", who.c_str()).c_str());
        if (n > 0) {
          socklen_t len = sizeof err;
          if (getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          break;
        }
        if (deadline.aborted()) return makeError(ridgeAborted, "%s: aborted while connecting", who.c_str());
        if (deadline.expired()) {
          err = ETIMEDOUT;
          break;
        }
      }
    }
    if (err == 0) {
      RIDGE_TRY(configureSocket(s.fd()));
      *out = std::move(s);
      return Status::ok();
    }
    lastErr = err;
    if (!retryableConnectError(err)) {
      errno = err;
      return systemError(format("%s: connect to %s", who.c_str(), addr.toString().c_str()).c_str());
    }
    // Back off, still watching the deadline and the abort flag.
    auto wakeAt = std::chrono::steady_clock::now() + std::chrono::milliseconds(backoffMs);
    while (std::chrono::steady_clock::now() < wakeAt && !deadline.expired() && !deadline.aborted())
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10, backoffMs)));
    backoffMs = std::min(backoffMs * 2, 500);
  }
}

Status acceptWithDeadline(const Socket& listener, const Deadline& deadline, const std::string& who,
                          Socket* out, SocketAddress* peer) {
  for (;;) {
    RIDGE_TRY(waitFd(listener.fd(), POLLIN, deadline, who + ": waiting for an incoming connection"));
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED || err == EPROTO)
        continue;
      errno = err;
      return systemError(format("%s: accept", who.c_str()).c_str());
    }
    Socket s(fd);
    RIDGE_TRY(configureSocket(fd));
    if (peer) *peer = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
    *out = std::move(s);
    return Status::ok();
  }
}

Status pollSlice(pollfd* fds, nfds_t count, const Deadline& deadline, int* ready) {
  int n = ::poll(fds, count, deadline.sliceMs());
  if (n < 0) {
    if (errno == EINTR) {
      *ready = 0;
      return Status::ok();
    }
    return systemError("bootstrap: poll");
  }
  *ready = n;
  return Status::ok();
}

Status waitFd(int fd, short events, const Deadline& deadline, const std::string& what) {
  for (;;) {
    RIDGE_TRY(deadline.check(what));
    pollfd p{fd, events, 0};
    int n = 0;
    RIDGE_TRY(pollSlice(&p, 1, deadline, &n));
    if (n > 0) {
      if (p.revents & POLLNVAL) return makeError(ridgeInternalError, "%s: socket is closed", what.c_str());
      return Status::ok();
    }
  }
}

static Status remoteClosed(const std::string& who, int err) {
  if (err == 0) return makeError(ridgeRemoteError, "%s closed the connection", who.c_str());
  return makeError(ridgeRemoteError, "%s closed the connection (%s)", who.c_str(), std::strerror(err));
}

Status sendSome(int fd, const iovec* iov, int iovCount, size_t* done, const std::string& who) {
  *done = 0;
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovCount);
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      *done = static_cast<size_t>(n);
      return Status::ok();
    }
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return Status::ok();
    if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) return remoteClosed(who, err);
    errno = err;
    return systemError(format("%s: send", who.c_str()).c_str());
  }
}

Status recvSome(int fd, void* data, size_t bytes, size_t* done, const std::string& who) {
  *done = 0;
  if (bytes == 0) return Status::ok();
  for (;;) {
    ssize_t n = ::recv(fd, data, bytes, MSG_DONTWAIT);
    if (n > 0) {
      *done = static_cast<size_t>(n);
      return Status::ok();
    }
    if (n == 0) return remoteClosed(who, 0);
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return Status::ok();
    if (err == ECONNRESET || err == ENOTCONN || err == EPIPE) return remoteClosed(who, err);
    errno = err;
    return systemError(format("%s: recv", who.c_str()).c_str());
  }
}

Status sendAllv(int fd, const iovec* iovIn, int iovCount, const Deadline& deadline, const std::string& who) {
  std::vector<iovec> iov(iovIn, iovIn + iovCount);
  size_t first = 0;
  size_t total = 0, sent = 0;
  for (const auto& v : iov) total += v.iov_len;
  while (first < iov.size() && iov[first].iov_len == 0) ++first;
  while (first < iov.size()) {
    size_t n = 0;
    RIDGE_TRY(sendSome(fd, iov.data() + first,
                       static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX)), &n, who));
    sent += n;
    while (n > 0 && first < iov.size()) {
      size_t take = std::min(n, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      n -= take;
      if (iov[first].iov_len == 0) ++first;
    }
    while (first < iov.size() && iov[first].iov_len == 0) ++first;
    if (first < iov.size())
      RIDGE_TRY(waitFd(fd, POLLOUT, deadline,
                       format("%s: sending (%zu of %zu bytes sent)", who.c_str(), sent, total)));
  }
  return Status::ok();
}

Status sendAll(int fd, const void* data, size_t bytes, const Deadline& deadline, const std::string& who) {
  iovec v{const_cast<void*>(data), bytes};
  return sendAllv(fd, &v, 1, deadline, who);
}

Status recvAll(int fd, void* data, size_t bytes, const Deadline& deadline, const std::string& who) {
  size_t got = 0;
  char* p = static_cast<char*>(data);
  while (got < bytes) {
    size_t n = 0;
    Status s = recvSome(fd, p + got, bytes - got, &n, who);
    if (!s.isOk()) {
      if (s.code() == ridgeRemoteError)
        return Status(s.code(), s.message() + format(" (received %zu of %zu bytes)", got, bytes));
      return s;
    }
    got += n;
    if (got < bytes)
      RIDGE_TRY(waitFd(fd, POLLIN, deadline,
                       format("%s: receiving (%zu of %zu bytes received)", who.c_str(), got, bytes)));
  }
  return Status::ok();
}

}  // namespace ridge
