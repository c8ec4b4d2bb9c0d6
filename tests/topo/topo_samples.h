// Where the topology tests find their input files: real machine descriptions published by
// others (../shared/topo_samples, beside the repository; tests that need them skip when it is
// absent) and our own small files (tests/topo/data). Both paths come from tests/topo/CMakeLists.txt.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

const std::string kSamples = RIDGE_TOPO_SAMPLES_DIR;
const std::string kData = RIDGE_TOPO_TEST_DATA_DIR;

#define SKIP_WITHOUT_SAMPLES()                                                     \
  do {                                                                             \
    if (!std::filesystem::is_directory(kSamples))                                  \
      GTEST_SKIP() << "topology samples not found at " << kSamples                 \
                   << " (they live beside the repository in shared/topo_samples)"; \
  } while (0)
