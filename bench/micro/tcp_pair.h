// Connection set-up shared by the two-host TCP micro-benchmarks (ridge-socket-stream,
// ridge-minimal-tcp-allreduce): a server that waits at most 30 s for its client, a client
// that retries for at most 30 s while the server starts. Errors end the program with the
// caller's name and errno's text.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tcppair {

[[noreturn]] inline void die(const char* prog, const char* what) {
  std::fprintf(stderr, "%s: %s: %s\n", prog, what, std::strerror(errno));
  std::exit(1);
}

// A listening socket on `addr` whose accept() gives up after 30 s.
inline int listenOn(const char* prog, const sockaddr_in& addr, int backlog) {
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) die(prog, "bind");
  if (listen(l, backlog) != 0) die(prog, "listen");
  timeval tv{30, 0};  // the client must arrive within 30 s
  setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return l;
}

inline int acceptOne(const char* prog, int listener) {
  const int c = accept(listener, nullptr, nullptr);
  if (c < 0) die(prog, "accept");
  return c;
}

// Connects to `addr`, retrying every 100 ms for up to 30 s while the server starts.
inline int connectWithRetry(const char* prog, const sockaddr_in& addr) {
  for (int attempt = 0; attempt < 300; ++attempt) {
    const int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) return c;
    close(c);
    usleep(100000);
  }
  die(prog, "connect");
}

}  // namespace tcppair
