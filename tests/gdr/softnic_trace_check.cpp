// ridge-softnic-trace-check FILE: checks a RIDGE_SOFTNIC_TRACE file (softnic_trace_check.h);
// exit 0 and a summary when every line holds, else 1 and the first line that does not.
#include "softnic_trace_check.h"

#include <cstdio>
#include <fstream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s TRACE_FILE\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "%s: cannot open %s\n", argv[0], argv[1]);
    return 2;
  }
  ridge::gdr::TraceSummary sum;
  std::string error;
  if (!ridge::gdr::checkSoftnicTrace(in, &sum, &error)) {
    std::fprintf(stderr, "softnic trace FAILED: %s\n", error.c_str());
    return 1;
  }
  std::printf("softnic trace ok: %llu mlx5 WQEs, %llu doorbell-record values, %zu queues\n",
              static_cast<unsigned long long>(sum.wqes), static_cast<unsigned long long>(sum.dbrs),
              sum.queues);
  return 0;
}
