// Chaos: communicator handles that are not (or no longer) live. A destroyed handle, a
// handle destroyed twice, a foreign pointer, garbage, and a stale handle while newer
// communicators exist are refused with ridgeInvalidArgument and a message, never read as a
// communicator; the live communicators keep working. One-rank communicators over loopback.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "chaos_record.h"
#include "ridge/ridge.h"

namespace {

using ridge::chaos::Outcome;

class Handles : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("RIDGE_SOCKET_IFNAME", "lo", 1);
    setenv("RIDGE_TIMEOUT", "10", 1);
  }
  static ridgeComm_t oneRank() {
    ridgeUniqueId id;
    EXPECT_EQ(ridgeGetUniqueId(&id), ridgeSuccess);
    ridgeComm_t c = nullptr;
    EXPECT_EQ(ridgeCommInitRank(&c, 1, id, 0), ridgeSuccess) << ridgeGetLastError(nullptr);
    return c;
  }
  // An allreduce on `c` that must be refused; returns the message. Poisoned output checked.
  static std::string refused(ridgeComm_t c, long* wrong) {
    float in[4] = {1, 2, 3, 4}, out[4] = {-7, -7, -7, -7};
    ridgeResult_t r = ridgeAllReduce(in, out, 4, ridgeFloat, ridgeSum, c, nullptr);
    if (r != ridgeInvalidArgument) ++*wrong;
    EXPECT_EQ(r, ridgeInvalidArgument);
    for (float v : out)
      if (v != -7) ++*wrong;  // a refused call wrote nothing
    return ridgeGetLastError(nullptr);
  }
  // A correct allreduce on a live communicator; counts wrong elements.
  static long works(ridgeComm_t c) {
    float in[4] = {1, 2, 3, 4}, out[4] = {-7, -7, -7, -7};
    if (ridgeAllReduce(in, out, 4, ridgeFloat, ridgeSum, c, nullptr) != ridgeSuccess) return 4;
    long wrong = 0;
    for (int i = 0; i < 4; ++i)
      if (out[i] != in[i]) ++wrong;
    return wrong;
  }
};

TEST_F(Handles, DestroyedHandleIsRefused) {
  long wrong = 0;
  ridgeComm_t c = oneRank();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(ridgeCommDestroy(c), ridgeSuccess);
  std::string m = refused(c, &wrong);
  EXPECT_NE(m.find("destroyed"), std::string::npos) << m;
  int n = 0;
  EXPECT_EQ(ridgeCommCount(c, &n), ridgeInvalidArgument);
  ridgeResult_t async = ridgeSuccess;
  EXPECT_EQ(ridgeCommGetAsyncError(c, &async), ridgeInvalidArgument);
  EXPECT_EQ(ridgeCommDestroy(c), ridgeInvalidArgument);  // destroyed twice
  EXPECT_EQ(ridgeCommAbort(c), ridgeInvalidArgument);
  ridge::chaos::record("handles", "allreduce, count, async error, destroy and abort on a destroyed handle",
                       Outcome::kCleanError, wrong);
}

TEST_F(Handles, StaleHandleBesideNewerCommunicators) {
  long wrong = 0;
  ridgeComm_t old = oneRank();
  ASSERT_NE(old, nullptr);
  ASSERT_EQ(ridgeCommDestroy(old), ridgeSuccess);
  // Newer communicators of the same size (an allocator would like to reuse the old memory).
  std::vector<ridgeComm_t> fresh;
  for (int i = 0; i < 4; ++i) {
    fresh.push_back(oneRank());
    ASSERT_NE(fresh.back(), nullptr);
    EXPECT_NE(fresh.back(), old) << "a new communicator took a destroyed one's address";
    if (fresh.back() == old) ++wrong;
  }
  std::string m = refused(old, &wrong);
  EXPECT_NE(m.find("stale"), std::string::npos) << m;
  for (ridgeComm_t c : fresh) wrong += works(c);
  for (ridgeComm_t c : fresh) EXPECT_EQ(ridgeCommDestroy(c), ridgeSuccess);
  ridge::chaos::record("handles", "stale handle used after 4 newer communicators were created",
                       Outcome::kCleanError, wrong);
}

TEST_F(Handles, ForeignAndGarbageHandlesAreNotRead) {
  long wrong = 0;
  // Pointers to memory that is not a communicator, and one to no memory at all: reading
  // them would crash or misbehave; the registry refuses them without a look.
  std::vector<unsigned char> bytes(4096, 0xAB);
  int onStack = 7;
  ridgeComm_t candidates[] = {reinterpret_cast<ridgeComm_t>(bytes.data()),
                              reinterpret_cast<ridgeComm_t>(&onStack),
                              reinterpret_cast<ridgeComm_t>(uintptr_t{0xdead0000}),
                              reinterpret_cast<ridgeComm_t>(uintptr_t{8})};
  for (ridgeComm_t c : candidates) {
    std::string m = refused(c, &wrong);
    EXPECT_NE(m.find("not a live communicator of this process"), std::string::npos) << m;
    EXPECT_EQ(ridgeCommDestroy(c), ridgeInvalidArgument);
  }
  ridge::chaos::record("handles", "allreduce and destroy on a heap buffer, a stack int, an unmapped address",
                       Outcome::kCleanError, wrong);
}

TEST_F(Handles, CopiedCommunicatorBytesAreForeign) {
  // A copy of a live communicator's bytes elsewhere (what a handle from another process
  // or a memcpy'd struct would look like): right magic, wrong address.
  long wrong = 0;
  ridgeComm_t c = oneRank();
  ASSERT_NE(c, nullptr);
  std::vector<unsigned char> copy(256);
  std::memcpy(copy.data(), reinterpret_cast<const void*>(c), copy.size());
  std::string m = refused(reinterpret_cast<ridgeComm_t>(copy.data()), &wrong);
  EXPECT_NE(m.find("not a live communicator of this process"), std::string::npos) << m;
  wrong += works(c);
  EXPECT_EQ(ridgeCommDestroy(c), ridgeSuccess);
  ridge::chaos::record("handles", "allreduce on a copy of a live communicator's first 256 bytes",
                       Outcome::kCleanError, wrong);
}

}  // namespace
