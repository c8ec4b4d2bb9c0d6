// libFuzzer harness: arbitrary bytes through the XML parser alone (xml.h), checking that
// what it accepts is a tree whose line numbers never go backwards.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_common.h"
#include "topo/xml.h"

namespace {

void check(const ridge::topo::XmlElement& e, int depth) {
  if (depth > 300 || e.name.empty() || e.line < 1) std::abort();
  int last = e.line;
  for (const auto& c : e.children) {
    if (c.line < last) std::abort();
    last = c.line;
    check(c, depth + 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ridge::fuzz::quietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ridge::topo::XmlElement root;
  if (ridge::topo::parseXml(text, "fuzz", &root).isOk()) check(root, 0);
  return 0;
}
