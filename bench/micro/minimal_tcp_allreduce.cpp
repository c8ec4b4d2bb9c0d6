// ridge-minimal-tcp-allreduce: the plainest two-rank TCP ring allreduce (float sum), as a
// reference point between the plain socket stream (ridge-socket-stream: no reduction, no
// dependency between the directions) and Ridge's allreduce over its socket transport.
//
//   ridge-minimal-tcp-allreduce server|client ADDR:PORT [-b BYTES] [-n ITERS] [-c CHUNK]
//   (BYTES and CHUNK take K, M or G; defaults 64M, 12 iterations, 1M)
//
// One connection, blocking sockets, TCP_NODELAY, the kernel's buffer auto-tuning. Each rank
// has a sender thread and a receiver thread. Reduce-scatter: the sender sends the peer's
// half of the input chunk by chunk; the receiver reads the peer's chunks of this rank's half
// into one cached chunk buffer and adds them to the input into the output. All-gather: the
// sender sends each reduced chunk of this rank's half as soon as the receiver has written it;
// the receiver reads the peer's reduced half straight into the output. No protocol, no
// progress engine, no pipelining across calls: what any implementation must at least do on
// these sockets. The server prints busbw (= bytes / time for two ranks), mean over the
// iterations after two warm-up calls, and checks the result of the last call.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tcp_pair.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ridge-minimal-tcp-allreduce: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

void sendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) die("send");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, 0);
    if (k == 0) {
      errno = ECONNRESET;
      die("recv: the peer closed the connection");
    }
    if (k < 0) die("recv");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// The input element i of rank r: small integers, so that float sums are exact.
float inputOf(int r, size_t i) {
  return static_cast<float>((i * 7 + static_cast<size_t>(r) * 3) % 13);
}

// BYTES with an optional K, M or G suffix (powers of 1024); 0 for anything else.
size_t parseBytes(const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text) return 0;
  const int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
  if (shift) ++end;
  return *end ? 0 : static_cast<size_t>(v) << shift;
}

int connectOrAccept(bool server, const sockaddr_in& addr) {
  constexpr const char* kProg = "ridge-minimal-tcp-allreduce";
  if (!server) return tcppair::connectWithRetry(kProg, addr);
  const int l = tcppair::listenOn(kProg, addr, 1);
  const int fd = tcppair::acceptOne(kProg, l);
  close(l);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || (std::strcmp(argv[1], "server") != 0 && std::strcmp(argv[1], "client") != 0)) {
    std::fprintf(
        stderr,
        "usage: ridge-minimal-tcp-allreduce server|client ADDR:PORT [-b BYTES] [-n ITERS] [-c CHUNK]\n");
    return 2;
  }
  const bool server = std::strcmp(argv[1], "server") == 0;
  const std::string hostPort = argv[2];
  const size_t colon = hostPort.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == std::string::npos ||
      inet_pton(AF_INET, hostPort.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    std::fprintf(stderr, "ridge-minimal-tcp-allreduce: expected IPV4:PORT, got %s\n", hostPort.c_str());
    return 2;
  }
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(hostPort.c_str() + colon + 1)));
  size_t bytes = size_t{64} << 20, chunk = size_t{1} << 20;
  int iters = 12;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-b")) bytes = parseBytes(argv[i + 1]);
    if (!std::strcmp(argv[i], "-n")) iters = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "-c")) chunk = parseBytes(argv[i + 1]);
  }
  // Both halves whole chunks of floats, so the two ranks cut them alike.
  if (bytes < 8 || bytes % 8 != 0 || bytes > (size_t{4} << 30) || chunk < 4 || chunk % 4 != 0 || iters < 3 ||
      iters > 10000) {
    std::fprintf(
        stderr,
        "ridge-minimal-tcp-allreduce: -b a multiple of 8 up to 4G, -c a multiple of 4, -n 3..10000\n");
    return 2;
  }
  const int fd = connectOrAccept(server, addr);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{60, 0};  // no step may wait longer than this for the peer
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

  const int r = server ? 0 : 1;
  const size_t n = bytes / 4, half = bytes / 2;
  const size_t mine = static_cast<size_t>(r) * half, theirs = static_cast<size_t>(1 - r) * half;
  std::vector<float> in(n), out(n, -1.0f), scratch(std::min(chunk, half) / 4);
  for (size_t i = 0; i < n; ++i) in[i] = inputOf(r, i);
  const char* inBytes = reinterpret_cast<const char*>(in.data());
  char* outBytes = reinterpret_cast<char*>(out.data());
  double total = 0;
  for (int it = 0; it < iters; ++it) {
    char token = 0;  // a one-byte barrier, so that both ranks start together
    sendAll(fd, &token, 1);
    recvAll(fd, &token, 1);
    const auto t0 = std::chrono::steady_clock::now();
    std::atomic<size_t> reduced{0};  // bytes of this rank's half already in `out`
    std::thread sender([&] {
      for (size_t o = 0; o < half; o += chunk) sendAll(fd, inBytes + theirs + o, std::min(chunk, half - o));
      for (size_t o = 0; o < half; o += chunk) {
        const size_t c = std::min(chunk, half - o);
        // Bounded by the receiver, which itself waits at most the socket timeout per read.
        while (reduced.load(std::memory_order_acquire) < o + c) std::this_thread::yield();
        sendAll(fd, outBytes + mine + o, c);
      }
    });
    for (size_t o = 0; o < half; o += chunk) {
      const size_t c = std::min(chunk, half - o);
      recvAll(fd, reinterpret_cast<char*>(scratch.data()), c);
      float* dst = reinterpret_cast<float*>(outBytes + mine + o);
      const float* src = reinterpret_cast<const float*>(inBytes + mine + o);
      for (size_t i = 0; i < c / 4; ++i) dst[i] = src[i] + scratch[i];
      reduced.store(o + c, std::memory_order_release);
    }
    recvAll(fd, outBytes + theirs, half);
    sender.join();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (it >= 2) total += t;
  }
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += out[i] != inputOf(0, i) + inputOf(1, i);
  close(fd);
  if (server)
    std::printf(
        "minimal ring allreduce: %zu bytes, %zu-byte chunks, busbw %.3f GB/s (mean of %d), wrong %zu\n",
        bytes, chunk, static_cast<double>(bytes) / (total / (iters - 2)) * 1e-9, iters - 2, wrong);
  return wrong == 0 ? 0 : 1;
}
