// libFuzzer harness: arbitrary bytes through the hwloc XML reader (and, when it accepts
// them, path queries on the graph). Build: tests/fuzz/CMakeLists.txt, RIDGE_BUILD_FUZZERS=ON.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "topo/load.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ridge::fuzz::quietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ridge::topo::Topology t;
  if (ridge::topo::parseHwlocXmlText(text, "fuzz", &t).isOk()) ridge::fuzz::exerciseGraph(t);
  return 0;
}
