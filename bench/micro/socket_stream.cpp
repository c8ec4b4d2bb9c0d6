// ridge-socket-stream: the ceiling for a TCP allreduce between two hosts. Both ends send
// and receive at once over N connections for a fixed time (what a 2-rank ring does: each
// rank sends S bytes and receives S bytes), and each end prints the bytes per second it
// received. A 2-rank allreduce's busbw can at best equal that per-direction rate.
//
//   ridge-socket-stream server ADDR:PORT [-s streams] [-t seconds] [-m message bytes] [-w bytes]
//   ridge-socket-stream client ADDR:PORT [same options]
//
// Blocking sockets, one sender and one receiver thread per connection, TCP_NODELAY, the
// kernel's buffer auto-tuning: the plain way to move bytes, with no protocol on top. By
// default every send and receive reuses one message-sized buffer per thread, which stays in
// the cache (as iperf3 does); -w BYTES makes each thread walk through a buffer of that size
// instead, message by message, so that the kernel copies from and into memory that is not
// cached, as a collective on large user buffers does.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tcp_pair.h"

namespace {

sockaddr_in parse(const std::string& hostPort) {
  size_t colon = hostPort.rfind(':');
  if (colon == std::string::npos) {
    std::fprintf(stderr, "ridge-socket-stream: expected ADDR:PORT, got %s\n", hostPort.c_str());
    std::exit(2);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(hostPort.c_str() + colon + 1)));
  if (inet_pton(AF_INET, hostPort.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    std::fprintf(stderr, "ridge-socket-stream: not an IPv4 address: %s\n", hostPort.c_str());
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: ridge-socket-stream server|client ADDR:PORT [-s N] [-t SEC] [-m BYTES]\n");
    return 2;
  }
  const bool server = std::strcmp(argv[1], "server") == 0;
  const sockaddr_in addr = parse(argv[2]);
  int streams = 2;
  double seconds = 3.0;
  size_t message = 1 << 20;
  size_t walk = 0;  // -w: bytes each thread walks through; 0 = one message-sized buffer
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-s")) streams = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "-t")) seconds = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "-m")) message = static_cast<size_t>(std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "-w")) walk = static_cast<size_t>(std::atoll(argv[i + 1]));
  }
  if (streams < 1 || streams > 64 || seconds <= 0 || seconds > 600 || message < 1 ||
      (walk && (walk < message || walk > (size_t{4} << 30)))) {
    std::fprintf(stderr, "ridge-socket-stream: -s 1..64, -t 0..600, -m >= 1, -w 0 or -m..4G\n");
    return 2;
  }
  const size_t span = walk ? walk / message * message : message;

  std::vector<int> fds;
  constexpr const char* kProg = "ridge-socket-stream";
  if (server) {
    const int l = tcppair::listenOn(kProg, addr, 64);
    for (int i = 0; i < streams; ++i) fds.push_back(tcppair::acceptOne(kProg, l));
    close(l);
  } else {
    for (int i = 0; i < streams; ++i) fds.push_back(tcppair::connectWithRetry(kProg, addr));
  }
  for (int fd : fds) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{seconds > 5 ? static_cast<time_t>(seconds) * 2 : 10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }

  // Both directions for `seconds`; then each sender shuts down its side, and receivers
  // count until end of stream.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received{0};
  std::vector<std::thread> threads;
  // Buffers are written before the clock starts, so their pages exist: one to send from and
  // one to receive into per connection.
  std::vector<std::vector<char>> sendBufs(fds.size(), std::vector<char>(span, 1));
  std::vector<std::vector<char>> recvBufs(fds.size(), std::vector<char>(span, 1));
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<int64_t> lastByteNs{0};
  for (size_t i = 0; i < fds.size(); ++i) {
    const int fd = fds[i];
    threads.emplace_back([&, fd, i] {
      std::vector<char>& buf = sendBufs[i];
      for (size_t off = 0; !stop.load(std::memory_order_relaxed); off = (off + message) % span) {
        if (send(fd, buf.data() + off, message, MSG_NOSIGNAL) < 0) break;
      }
      shutdown(fd, SHUT_WR);
    });
    threads.emplace_back([&, fd, i] {
      std::vector<char>& buf = recvBufs[i];
      for (size_t off = 0;; off = (off + message) % span) {
        ssize_t n = recv(fd, buf.data() + off, message, 0);
        if (n <= 0) break;
        received.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
        lastByteNs.store(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
                .count(),
            std::memory_order_relaxed);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& t : threads) t.join();
  for (int fd : fds) close(fd);
  const double elapsed = static_cast<double>(lastByteNs.load()) * 1e-9;
  std::printf(
      "%s: %d streams, %zu-byte sends from and receives into %zu bytes per thread, both directions at once: "
      "received %.3f GB in %.2f s = %.3f GB/s\n",
      server ? "server" : "client", streams, message, span, static_cast<double>(received.load()) * 1e-9,
      elapsed, static_cast<double>(received.load()) / elapsed * 1e-9);
  return 0;
}
