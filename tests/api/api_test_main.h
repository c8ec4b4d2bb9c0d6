// main() of the API tests: before any library call, a loopback bootstrap and a timeout that
// bounds every wait.
#pragma once

#include "rank_launcher.h"

int main(int argc, char** argv) {
  ridgetest::setLoopbackEnv();
  setenv("RIDGE_TIMEOUT", "10", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
