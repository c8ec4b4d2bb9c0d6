// Helpers the softnic tests share: a monotonic clock in seconds and a bounded CQ poll.
#pragma once

#include <chrono>
#include <vector>

#include "transports/verbs/verbs.h"

namespace ridge::softnic_test {

inline double nowSec() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Polls `cq` until `want` completions arrived or `seconds` passed.
inline std::vector<verbs::Cqe> pollN(verbs::CompletionQueue* cq, size_t want, double seconds = 10) {
  std::vector<verbs::Cqe> got;
  const double end = nowSec() + seconds;
  verbs::Cqe buf[16];
  while (got.size() < want && nowSec() < end) {
    int n = cq->poll(buf, 16);
    for (int i = 0; i < n; ++i) got.push_back(buf[i]);
    if (n == 0) cq->wait(2000000, nullptr, nullptr);
  }
  return got;
}

}  // namespace ridge::softnic_test
