// Logging. Controlled by RIDGE_DEBUG (NONE, WARN, INFO, TRACE); lines go to stderr
// prefixed with host, pid and rank so that interleaved multi-rank output stays legible.
#pragma once

namespace ridge {

enum class LogLevel { None = 0, Warn = 1, Info = 2, Trace = 3 };

// Level chosen by RIDGE_DEBUG, read once.
LogLevel logLevel();
// Sets the rank shown in the prefix of this process's log lines (-1: none).
void setLogRank(int rank);
void logLine(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace ridge

#define RIDGE_WARN(...) ::ridge::logLine(::ridge::LogLevel::Warn, __VA_ARGS__)
#define RIDGE_INFO(...)                                              \
  do {                                                               \
    if (::ridge::logLevel() >= ::ridge::LogLevel::Info) [[unlikely]] \
      ::ridge::logLine(::ridge::LogLevel::Info, __VA_ARGS__);        \
  } while (0)
#define RIDGE_TRACE(...)                                              \
  do {                                                                \
    if (::ridge::logLevel() >= ::ridge::LogLevel::Trace) [[unlikely]] \
      ::ridge::logLine(::ridge::LogLevel::Trace, __VA_ARGS__);        \
  } while (0)
