#include "core/log.h"

#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ridge/version.h"

namespace ridge {

static LogLevel parseLevel() {
  // Read directly rather than through settings.h so that logging works while settings
  // themselves are being parsed (a malformed setting logs a WARN).
  const char* v = std::getenv("RIDGE_DEBUG");
  if (!v || !*v) return LogLevel::Warn;
  if (!strcasecmp(v, "NONE")) return LogLevel::None;
  if (!strcasecmp(v, "WARN")) return LogLevel::Warn;
  if (!strcasecmp(v, "INFO")) return LogLevel::Info;
  if (!strcasecmp(v, "TRACE")) return LogLevel::Trace;
  return LogLevel::Warn;
}

LogLevel logLevel() {
  static const LogLevel level = parseLevel();
  return level;
}

static std::atomic<int> gLogRank{-1};
void setLogRank(int rank) {
  gLogRank.store(rank, std::memory_order_relaxed);
}

static void writeLine(LogLevel level, const char* fmt, va_list ap);

static void writeLineF(LogLevel level, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  writeLine(level, fmt, ap);
  va_end(ap);
}

void logLine(LogLevel level, const char* fmt, ...) {
  if (logLevel() < level) return;
  // With INFO or TRACE on, the first line a process logs says which Ridge it runs, so that a
  // log attached to a bug report names the version (as NCCL's first INFO line does).
  static std::once_flag versionOnce;
  if (logLevel() >= LogLevel::Info)
    std::call_once(versionOnce, [] {
      writeLineF(LogLevel::Info, "Ridge version %d.%d.%d", RIDGE_MAJOR, RIDGE_MINOR, RIDGE_PATCH);
    });
  va_list ap;
  va_start(ap, fmt);
  writeLine(level, fmt, ap);
  va_end(ap);
}

static void writeLine(LogLevel level, const char* fmt, va_list ap) {
  static char host[64] = {0};
  if (!host[0]) {
    if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
    if (char* dot = std::strchr(host, '.')) *dot = 0;
  }
  const char* tag = level == LogLevel::Warn ? "WARN" : level == LogLevel::Info ? "INFO" : "TRACE";
  char line[2048];
  int rank = gLogRank.load(std::memory_order_relaxed);
  int n = rank >= 0 ? std::snprintf(line, sizeof line, "%s:%d:r%d RIDGE %s ", host, getpid(), rank, tag)
                    : std::snprintf(line, sizeof line, "%s:%d RIDGE %s ", host, getpid(), tag);
  if (n >= 0 && n < static_cast<int>(sizeof line)) n += std::vsnprintf(line + n, sizeof line - n, fmt, ap);
  if (n > static_cast<int>(sizeof line) - 2) n = sizeof line - 2;
  line[n++] = '\n';
  // One write per line keeps lines of concurrent ranks from interleaving.
  ssize_t ignored = write(2, line, n);
  (void)ignored;
}

}  // namespace ridge
