// RIDGE_TEST_TIME_SCALE: the factor every timeout, deadline and "within N seconds" bound inside
// a test scales with (default 1; values below 1, above 100 or unreadable count as 1).
// tests/stress.sh sets it while it loads the machine, so that a bound that guards against a
// hang is not mistaken for one when the test's threads wait for a CPU (docs/testing.md).
//
// Scaled: how long a test waits before it calls something a hang, the harness deadlines, the
// communicator timeouts a test does not expect to fire. Not scaled: a timeout that is the
// thing under test (a RIDGE_TIMEOUT of 1 s that must fire, and the lower bound of how long it
// took). A test that needs time to pass for something to happen waits on an event instead.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdlib>

namespace ridgetest {

inline double timeScale() {
  static const double scale = [] {
    const char* text = std::getenv("RIDGE_TEST_TIME_SCALE");
    const double f = text ? std::strtod(text, nullptr) : 1.0;
    return f >= 1.0 && f <= 100.0 ? f : 1.0;
  }();
  return scale;
}

// `d` times the factor, in milliseconds (rounded up).
template <class Rep, class Period>
std::chrono::milliseconds scaled(std::chrono::duration<Rep, Period> d) {
  const double ms = std::chrono::duration<double, std::milli>(d).count() * timeScale();
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(ms)));
}

// Seconds times the factor: as double (elapsed-time bounds) and as whole seconds rounded up
// (communicator and harness timeouts).
inline double scaledSeconds(double seconds) {
  return seconds * timeScale();
}
inline int scaledSeconds(int seconds) {
  return static_cast<int>(std::ceil(seconds * timeScale()));
}

}  // namespace ridgetest
