// The trace checker (softnic_trace_check.h) accepts a well-formed trace and rejects each kind of
// fault it exists to catch.
#include "softnic_trace_check.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>

namespace ridge::gdr {
namespace {

std::string wqeLine(uint32_t qpn, uint32_t pi, uint16_t index, uint8_t opcode = mlx5::kOpRdmaWriteImm) {
  mlx5::WqeBuf w;
  const uint32_t ds =
      mlx5::buildWqe(&w, opcode, index, qpn, mlx5::kCtrlCqUpdate, pi, 0x1000, 7, 0x2000, 9, 64);
  std::string hex;
  char b[3];
  for (uint32_t i = 0; i < mlx5::wqeBbs(ds) * mlx5::kWqeBbBytes; ++i) {
    std::snprintf(b, sizeof b, "%02x", w.bytes[i]);
    hex += b;
  }
  return "wqe " + std::to_string(qpn) + " " + std::to_string(pi) + " " + hex + "\n";
}
std::string dbrLine(uint32_t qpn, uint32_t value) {
  char b[32];
  std::snprintf(b, sizeof b, "dbr %u %08x\n", qpn, value);
  return b;
}

bool check(const std::string& text, std::string* error) {
  std::istringstream in(text);
  TraceSummary sum;
  return checkSoftnicTrace(in, &sum, error);
}

TEST(SoftnicTraceCheck, AcceptsAWellFormedTraceOfTwoQueues) {
  const std::string good = dbrLine(5, 2) + wqeLine(5, 0, 0) + dbrLine(9, 1) + wqeLine(9, 0, 0) +
                           wqeLine(5, 1, 1) + dbrLine(5, 3) + wqeLine(5, 2, 2);
  std::string error;
  EXPECT_TRUE(check(good, &error)) << error;
}

TEST(SoftnicTraceCheck, RejectsEachFault) {
  std::string error;
  EXPECT_FALSE(check(dbrLine(5, 1) + wqeLine(5, 0, 3), &error)) << "index is not the producer index";
  EXPECT_NE(error.find("index"), std::string::npos) << error;
  EXPECT_FALSE(check(dbrLine(5, 2) + wqeLine(5, 1, 1), &error)) << "first WQE not at 0";
  EXPECT_FALSE(check(dbrLine(5, 3) + wqeLine(5, 0, 0) + wqeLine(5, 2, 2), &error)) << "gap";
  EXPECT_FALSE(check(dbrLine(5, 1) + wqeLine(5, 0, 0) + wqeLine(5, 1, 1), &error)) << "beyond the record";
  EXPECT_FALSE(check(dbrLine(5, 1) + wqeLine(5, 0, 0, 0x0c), &error)) << "opcode outside the subset";
  EXPECT_FALSE(check(dbrLine(5, 2) + wqeLine(5, 0, 0) + dbrLine(5, 1), &error)) << "record went back";
  EXPECT_FALSE(check(dbrLine(5, 2) + wqeLine(5, 0, 0), &error)) << "a published WQE never consumed";
  EXPECT_FALSE(check(dbrLine(5, 1) + wqeLine(7, 0, 0), &error)) << "WQE names another QP / no record";
  std::string torn = dbrLine(5, 1) + wqeLine(5, 0, 0);
  torn.erase(torn.size() - 3, 2);  // a line cut short: not whole blocks
  EXPECT_FALSE(check(torn, &error));
  EXPECT_FALSE(check("", &error)) << "an empty trace proves nothing";
}

}  // namespace
}  // namespace ridge::gdr
