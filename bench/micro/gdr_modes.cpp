// ridge-gdr-modes: the three ways a send reaches the NIC (gdr-read, gdr-write, host-staged),
// compared on one GPU-NIC placement of a topology preset or file.
//
//   1. the PCIe model alone (the GDR advisor's table: small-message latency, large-message
//      bandwidth), labelled "modeled";
//   2. end to end over the software NIC with the data path paced by that model
//      (RIDGE_SOFTNIC_PCIE_MODEL): 2 forked ranks, 8-byte ping-pong latency and large sendrecv
//      bandwidth per mode, also "modeled" (the times come from the model, not from a bus);
//   3. with --unpaced: gdr-write over the software NIC with no model, next to Ridge's plain
//      shared-memory and TCP paths in the same run (what the emulation itself costs).
//
// Usage: ridge-gdr-modes [--model cross-rc] [--scale N] [--bytes 64M] [--iters 5] [--unpaced]
// --scale multiplies the modeled times inside the data path (RIDGE_GDR_PACE_SCALE) so that an
// emulated NIC slower than the model still shows its ratios; results are divided back.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ridge/ridge.h"
#include "topo/gdr_advisor.h"
#include "transports/gdr/gdr_model.h"
#include "transports/gdr/gdr_transport.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Config {
  std::string label;
  std::vector<std::pair<std::string, std::string>> env;
};

struct Result {
  double latencyUs = 0;
  double bandwidthGBs = 0;
  bool ok = false;
};

// Rank body: 8-byte ping-pong, then sendrecv of `bytes` each way; rank 0 writes the result.
int rankMain(int rank, const ridgeUniqueId& id, size_t bytes, int iters, int outFd) {
  ridgeComm_t comm;
  if (ridgeCommInitRank(&comm, 2, id, rank) != ridgeSuccess) return 2;
  const int peer = 1 - rank;
  std::vector<char> small(8, 1), big(bytes, static_cast<char>(rank)), in(bytes);
  auto pingPong = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (rank == 0) {
        ridgeSend(small.data(), 8, ridgeInt8, peer, comm, nullptr);
        ridgeRecv(small.data(), 8, ridgeInt8, peer, comm, nullptr);
      } else {
        ridgeRecv(small.data(), 8, ridgeInt8, peer, comm, nullptr);
        ridgeSend(small.data(), 8, ridgeInt8, peer, comm, nullptr);
      }
    }
  };
  auto exchange = [&]() {
    ridgeGroupStart();
    ridgeSend(big.data(), bytes, ridgeInt8, peer, comm, nullptr);
    ridgeRecv(in.data(), bytes, ridgeInt8, peer, comm, nullptr);
    return ridgeGroupEnd();
  };
  pingPong(20);
  const int pp = 300;
  double t0 = now();
  pingPong(pp);
  const double lat = (now() - t0) / pp / 2;
  if (exchange() != ridgeSuccess) return 3;
  t0 = now();
  for (int i = 0; i < iters; ++i)
    if (exchange() != ridgeSuccess) return 3;
  const double bw = static_cast<double>(bytes) * iters / (now() - t0) / 1e9;
  if (in[0] != static_cast<char>(peer) || in[bytes - 1] != static_cast<char>(peer)) return 4;
  if (rank == 0) {
    const ridge::gdr::Counters c = ridge::gdr::processCounters();
    char line[256];
    int n = std::snprintf(line, sizeof line, "%.9f %.6f %llu\n", lat, bw,
                          static_cast<unsigned long long>(c.stagedLost));
    if (write(outFd, line, static_cast<size_t>(n)) != n) return 5;
  }
  ridgeCommFinalize(comm);
  ridgeCommDestroy(comm);
  return 0;
}

Result run(const Config& cfg, size_t bytes, int iters) {
  Result r;
  int fds[2];
  if (pipe(fds) != 0) return r;
  for (const auto& kv : cfg.env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  ridgeUniqueId id;
  if (ridgeGetUniqueId(&id) != ridgeSuccess) return r;
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      close(fds[0]);
      _exit(rankMain(rank, id, bytes, iters, fds[1]));
    }
  }
  close(fds[1]);
  bool good = true;
  const double deadline = now() + 300;
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    while (waitpid(pids[rank], &status, WNOHANG) == 0) {
      if (now() > deadline) {
        kill(pids[rank], SIGKILL);
        waitpid(pids[rank], &status, 0);
        good = false;
        break;
      }
      usleep(10000);
    }
    good = good && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  char buf[256] = {0};
  ssize_t got = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  unsigned long long lost = 1;
  if (good && got > 0 && std::sscanf(buf, "%lf %lf %llu", &r.latencyUs, &r.bandwidthGBs, &lost) == 3 &&
      lost == 0) {
    r.latencyUs *= 1e6;
    r.ok = true;
  }
  for (const auto& kv : cfg.env) unsetenv(kv.first.c_str());
  return r;
}

size_t parseBytes(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end && (*end == 'K' || *end == 'k')) v *= 1024;
  if (end && (*end == 'M' || *end == 'm')) v *= 1024 * 1024;
  if (end && (*end == 'G' || *end == 'g')) v *= 1024.0 * 1024 * 1024;
  return static_cast<size_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "cross-rc";
  int scale = 1, iters = 5;
  size_t bytes = 64u << 20;
  bool unpaced = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--scale" && i + 1 < argc) {
      scale = std::atoi(argv[++i]);
    } else if (a == "--bytes" && i + 1 < argc) {
      bytes = parseBytes(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--unpaced") {
      unpaced = true;
    } else {
      std::fprintf(stderr,
                   "usage: ridge-gdr-modes [--model PRESET|FILE] [--scale N] [--bytes 64M] [--iters 5] "
                   "[--unpaced]\n");
      return 2;
    }
  }
  if (scale < 1 || scale > 1000 || iters < 1 || bytes < 8) {
    std::fprintf(stderr, "ridge-gdr-modes: --scale 1..1000, --iters >= 1, --bytes >= 8\n");
    return 2;
  }
  setenv("RIDGE_SOCKET_IFNAME", getenv("RIDGE_SOCKET_IFNAME") ? getenv("RIDGE_SOCKET_IFNAME") : "lo", 1);

  if (!unpaced) {
    ridge::gdr::ModelView view;
    ridge::Status s = ridge::gdr::loadModel(model, "", &view);
    if (!s.isOk()) {
      std::fprintf(stderr, "ridge-gdr-modes: %s\n", s.message().c_str());
      return 1;
    }
    std::printf("# PCIe model alone (modeled), %s\n%s\n\n", view.source.c_str(),
                ridge::topo::gdrAdviceText(view.advice).c_str());
    std::printf("# End to end over the software NIC, data path paced by the model (modeled%s), 2 ranks\n",
                scale > 1 ? ", time-scaled and divided back" : "");
    std::printf("# %-12s %14s %22s %s\n", "mode", "8 B latency us", "sendrecv GB/s", "(bytes per direction)");
    for (const char* mode : {"read", "write", "staged"}) {
      Config c{mode,
               {{"RIDGE_SHM", "0"},
                {"RIDGE_NET", "softnic"},
                {"RIDGE_GDR_MODE", mode},
                {"RIDGE_SOFTNIC_PCIE_MODEL", model},
                {"RIDGE_GDR_PACE_SCALE", std::to_string(scale)}}};
      Result r = run(c, bytes, iters);
      ridge::gdr::Mode m;
      ridge::gdr::parseMode(mode, &m);
      if (!r.ok) {
        std::printf("  %-12s failed\n", ridge::gdr::modeName(m));
        continue;
      }
      std::printf("  %-12s %14.2f %22.2f   modeled: %.2f us, %.1f GB/s\n", ridge::gdr::modeName(m),
                  r.latencyUs / scale, r.bandwidthGBs * scale,
                  view.timing[static_cast<int>(m)].latencyNs / 1000,
                  view.timing[static_cast<int>(m)].bandwidthGBs);
    }
    return 0;
  }
  std::printf("# Unpaced, 2 ranks on this host, %zu bytes per direction, measured\n", bytes);
  std::printf("# %-34s %14s %16s\n", "path", "8 B latency us", "sendrecv GB/s");
  const std::vector<Config> configs = {
      {"gdr-write over softnic", {{"RIDGE_SHM", "0"}, {"RIDGE_NET", "softnic"}, {"RIDGE_GDR_MODE", "write"}}},
      {"gdr-read over softnic", {{"RIDGE_SHM", "0"}, {"RIDGE_NET", "softnic"}, {"RIDGE_GDR_MODE", "read"}}},
      {"host-staged over softnic",
       {{"RIDGE_SHM", "0"}, {"RIDGE_NET", "softnic"}, {"RIDGE_GDR_MODE", "staged"}}},
      {"plain TCP (socket transport)",
       {{"RIDGE_SHM", "0"}, {"RIDGE_NET", "socket"}, {"RIDGE_GDR_MODE", "off"}}},
      {"plain shared memory (shm)", {{"RIDGE_SHM", "1"}, {"RIDGE_GDR_MODE", "off"}}},
  };
  for (const Config& c : configs) {
    Result r = run(c, bytes, iters);
    if (!r.ok) {
      std::printf("  %-34s failed\n", c.label.c_str());
      continue;
    }
    std::printf("  %-34s %14.2f %16.2f\n", c.label.c_str(), r.latencyUs, r.bandwidthGBs);
  }
  return 0;
}
