// One row of the chaos table in docs/reliability.md per test case: what the case did to
// Ridge and what came of it. The table is built from GoogleTest's JSON output of the
// binaries labelled `chaos` (tests/chaos/), which carries these properties per test case,
// so a case that fails its own assertions still shows up as failed in the table.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace ridge::chaos {

// What happened to the job after the fault, in the table's words.
enum class Outcome {
  kCleanError,  // every affected call returned an error code with a message; nothing hung
  kRecovered,   // the genuine job (or the survivors) went on and got correct results
  kRanCorrectly,  // the fault was absorbed without any error (e.g. softnic retransmits)
};

inline const char* outcomeName(Outcome o) {
  switch (o) {
    case Outcome::kCleanError: return "clean error";
    case Outcome::kRecovered: return "recovered";
    case Outcome::kRanCorrectly: return "ran correctly";
  }
  return "?";
}

// area: the layer attacked (shm, tcp, softnic, bootstrap, settings, mismatch, handles, files).
// tried: one line saying what was done ("kill -9 rank 1 between shm_open and unlink").
// lostData: elements found wrong or missing in results checked after the fault (must be 0).
// leaks: /dev/shm segments or file descriptors left behind (must be 0).
inline void record(const std::string& area, const std::string& tried, Outcome outcome,
                   long lostData, long leaks = 0) {
  ::testing::Test::RecordProperty("chaos_area", area);
  ::testing::Test::RecordProperty("chaos_tried", tried);
  ::testing::Test::RecordProperty("chaos_outcome", outcomeName(outcome));
  ::testing::Test::RecordProperty("chaos_lost_data", std::to_string(lostData));
  ::testing::Test::RecordProperty("chaos_leaks", std::to_string(leaks));
}

}  // namespace ridge::chaos
