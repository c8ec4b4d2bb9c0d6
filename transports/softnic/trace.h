// The softnic trace (RIDGE_SOFTNIC_TRACE): WQEs as the engine consumed them and doorbell-record
// values, in the bytes a ConnectX NIC would see.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/log.h"
#include "core/settings.h"
#include "kernels/gdr/mlx5_wire.h"

namespace ridge {
namespace softnic {

// RIDGE_SOFTNIC_TRACE: one line per consumed WQE and per new doorbell-record value, each
// written with one write() to an O_APPEND file, so the lines of several NICs and processes
// never interleave mid-line. Off (one branch) unless the setting names a file.
class Trace {
 public:
  static Trace& get() {
    static Trace t;
    return t;
  }
  bool on() const { return fd_ >= 0; }
  void wqe(uint32_t qpn, uint32_t pi, const uint8_t* bytes, uint32_t n) {
    char line[64 + 2 * mlx5::kMaxWqeBbs * mlx5::kWqeBbBytes];
    int at = std::snprintf(line, 64, "wqe %u %u ", qpn, pi);
    static const char kHex[] = "0123456789abcdef";
    for (uint32_t i = 0; i < n; ++i) {
      line[at++] = kHex[bytes[i] >> 4];
      line[at++] = kHex[bytes[i] & 15];
    }
    line[at++] = '\n';
    emit(line, at);
  }
  void dbr(uint32_t qpn, uint32_t beWord) {
    char line[64];
    // The word as it sits in memory, read as a big-endian number.
    const int at = std::snprintf(line, sizeof line, "dbr %u %08x\n", qpn, mlx5::be32(beWord));
    emit(line, at);
  }

 private:
  Trace() {
    const std::string path = settingString(Setting::SOFTNIC_TRACE);
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      RIDGE_WARN("softnic: RIDGE_SOFTNIC_TRACE=%s: %s (no trace)", path.c_str(), std::strerror(errno));
  }
  void emit(const char* line, int n) {
    if (::write(fd_, line, static_cast<size_t>(n)) != n) {
    }
  }
  int fd_ = -1;
};

}  // namespace softnic
}  // namespace ridge
