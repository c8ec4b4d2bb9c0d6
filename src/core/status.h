// Internal error type. Every failure inside Ridge is a Status carrying a result code
// and a message; the C API layer (src/api/) turns it into the returned code and the
// ridgeGetLastError() text in one place. The code that first classifies an error
// builds the Status (with the peer, the call, the errno) and logs it at WARN.
#pragma once

#include <string>
#include <utility>

#include "ridge/ridge.h"

namespace ridge {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ridgeResult_t code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool isOk() const { return code_ == ridgeSuccess; }
  explicit operator bool() const { return isOk(); }
  ridgeResult_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ridgeResult_t code_ = ridgeSuccess;
  std::string message_;
};

// printf-style message builder, so call sites stay one line.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Builds a Status and logs it at WARN level (the classifying site logs, nobody else).
Status makeError(ridgeResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Status for a failed system call: appends strerror(errno).
Status systemError(const char* what);

}  // namespace ridge

#define RIDGE_TRY(expr)                \
  do {                                 \
    ::ridge::Status ridge_s_ = (expr); \
    if (!ridge_s_.isOk()) [[unlikely]] \
      return ridge_s_;                 \
  } while (0)
