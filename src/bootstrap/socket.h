// TCP socket helpers shared by the bootstrap layer and the TCP transport: address parsing
// and printing, network interface selection, and socket operations that never block
// without a bound. Every wait is a poll() of at most kPollSliceMs; between slices the
// deadline and the caller's abort flag are checked, so no call can hang forever.
//
// Sockets are non-blocking, TCP_NODELAY, close-on-exec; sends use MSG_NOSIGNAL so a
// closed peer is an error code, never a SIGPIPE.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ridge {

// Longest single wait inside any socket helper, in milliseconds.
constexpr int kPollSliceMs = 100;

// An IPv4 or IPv6 socket address (port included).
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return length == 0 ? AF_UNSPEC : storage.ss_family; }
  bool valid() const;
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&storage); }
  uint16_t port() const;  // host byte order
  void setPort(uint16_t port);
  bool isLoopback() const;
  bool isLinkLocal() const;  // IPv6 fe80::/10
  // "1.2.3.4:5678" or "[::1]:5678" ("[fe80::1%eth0]:5678" with a scope).
  std::string toString() const;
  // Without the port: "1.2.3.4" or "::1".
  std::string hostString() const;

  static SocketAddress fromSockaddr(const sockaddr* sa, socklen_t len);
  static SocketAddress loopback(int family, uint16_t port = 0);
};

bool operator==(const SocketAddress& a, const SocketAddress& b);

// Parses "host:port", "[ipv6]:port", "[ipv6%scope]:port". host is a numeric address or
// a name (resolved with getaddrinfo, IPv4 preferred). An unbracketed IPv6 literal is
// rejected because its port cannot be told apart. Port 0..65535. Failures are
// ridgeInvalidArgument naming the text.
Status parseHostPort(const std::string& text, SocketAddress* out);
// Splits without resolving: "[::1]:80" -> ("::1", 80). Same errors as parseHostPort.
Status splitHostPort(const std::string& text, std::string* host, uint16_t* port);

// One address of one network interface.
struct InterfaceAddress {
  std::string name;
  SocketAddress address;  // port 0
  bool up = false;
  bool loopback = false;
};

// Every IPv4/IPv6 address of every interface, in getifaddrs order.
std::vector<InterfaceAddress> listInterfaces();

// Whether interface `name` is selected by a RIDGE_SOCKET_IFNAME-style spec: a comma
// separated list of prefixes; a leading '^' turns it into an exclude list; a leading
// '=' (after the optional '^') makes the names exact. An empty spec matches everything.
bool interfaceMatches(const std::string& spec, const std::string& name);

// Picks the address to listen on. With a non-empty spec: the first up interface the
// spec matches (loopback allowed when matched). With an empty spec: the first up
// non-loopback interface, loopback as last resort. Among the addresses of the chosen
// kind, those of `preferFamily` come first (AF_UNSPEC: IPv4 first), and IPv6
// link-local addresses last. Errors: ridgeSystemError when nothing matches.
Status selectInterface(const std::string& spec, int preferFamily, SocketAddress* out, std::string* ifName);
// AF_INET / AF_INET6 as RIDGE_SOCKET_FAMILY asks, AF_UNSPEC for auto.
int preferredFamily();
// Same with the spec read from RIDGE_SOCKET_IFNAME (and, for AF_UNSPEC, the family from
// RIDGE_SOCKET_FAMILY).
Status selectInterface(int preferFamily, SocketAddress* out, std::string* ifName);

// Wall-clock bound and cancellation for a blocking operation.
struct Deadline {
  std::chrono::steady_clock::time_point when;
  const std::atomic<bool>* abortFlag = nullptr;
  int timeoutSec = 0;

  // There is no "wait forever": timeoutSec <= 0 is clamped to 1 second.
  static Deadline after(int timeoutSec, const std::atomic<bool>* abortFlag = nullptr);
  // A tighter deadline that still honours the abort flag (min of the two).
  Deadline capped(std::chrono::milliseconds limit) const;
  bool expired() const { return std::chrono::steady_clock::now() >= when; }
  bool aborted() const { return abortFlag && abortFlag->load(std::memory_order_relaxed); }
  // Milliseconds to wait in the next poll: min(kPollSliceMs, remaining), >= 0.
  int sliceMs() const;
  // ok, or the ridgeAborted / ridgeTimeout Status for "what".
  Status check(const std::string& what) const;
};

// Owns a file descriptor; closes it on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Non-blocking listening socket bound to `addr` (port 0: the kernel picks one);
// `bound` receives the actual address.
Status listenOn(const SocketAddress& addr, Socket* out, SocketAddress* bound);

// Connects to `addr`, retrying with backoff (10 ms doubling to 500 ms) while the peer
// refuses or is unreachable, until the deadline (ridgeTimeout) or abort (ridgeAborted).
// `who` names the peer in messages, e.g. "bootstrap: rank 3: root at 10.0.0.1:2345".
Status connectWithRetry(const SocketAddress& addr, const Deadline& deadline, const std::string& who,
                        Socket* out);

// Accepts one connection; waits in slices until the deadline.
Status acceptWithDeadline(const Socket& listener, const Deadline& deadline, const std::string& who,
                          Socket* out, SocketAddress* peer);

// Waits until `fd` has `events` (POLLIN/POLLOUT); POLLHUP/POLLERR count as ready so the
// following read or write reports the error. Bounded by the deadline.
Status waitFd(int fd, short events, const Deadline& deadline, const std::string& what);

// One poll slice over several descriptors (<= kPollSliceMs). *ready gets poll()'s
// count (0 when the slice passed). EINTR counts as an empty slice. Does not check the
// deadline: callers loop and call deadline.check().
Status pollSlice(pollfd* fds, nfds_t count, const Deadline& deadline, int* ready);

// Single non-blocking attempts; *done gets the bytes moved (0 when the socket would
// block). A closed or reset peer is ridgeRemoteError "<who> closed the connection".
Status sendSome(int fd, const iovec* iov, int iovCount, size_t* done, const std::string& who);
Status recvSome(int fd, void* data, size_t bytes, size_t* done, const std::string& who);

// Sends/receives exactly `bytes`, waiting in slices until the deadline.
Status sendAll(int fd, const void* data, size_t bytes, const Deadline& deadline, const std::string& who);
Status sendAllv(int fd, const iovec* iov, int iovCount, const Deadline& deadline, const std::string& who);
Status recvAll(int fd, void* data, size_t bytes, const Deadline& deadline, const std::string& who);

// Sets TCP_NODELAY, O_NONBLOCK and FD_CLOEXEC on a socket.
Status configureSocket(int fd);

}  // namespace ridge
