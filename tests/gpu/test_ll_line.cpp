// The LL line format (kernels/ll_line.h) compiled as host code: the encode/decode rules the
// GPU kernels rely on, checked in every build (no GPU needed). The device kernels that use
// the same functions are checked in test_gpu_ll.cpp on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ll_line.h"

namespace ridge::ll {
namespace {

TEST(LLLine, LayoutIsDataFlagDataFlag) {
  const Line l = encode(0x1122334455667788ull, 0xA5A5A5A5u);
  unsigned char raw[16];
  std::memcpy(raw, &l, sizeof raw);
  uint32_t word[4];
  std::memcpy(word, raw, sizeof word);
  EXPECT_EQ(word[0], 0x55667788u);  // payload bytes 0..3
  EXPECT_EQ(word[1], 0xA5A5A5A5u);
  EXPECT_EQ(word[2], 0x11223344u);  // payload bytes 4..7
  EXPECT_EQ(word[3], 0xA5A5A5A5u);
  EXPECT_EQ(alignof(Line), 16u);
}

TEST(LLLine, EncodeDecodeRoundTrip) {
  std::mt19937_64 rng(3);
  for (int k = 0; k < 10000; ++k) {
    const uint64_t v = rng();
    const uint32_t f = static_cast<uint32_t>(rng()) | 1u;
    const Line l = encode(v, f);
    EXPECT_TRUE(ready(l, f));
    EXPECT_FALSE(ready(l, f + 1));
    EXPECT_EQ(payloadOf(l), v);
  }
}

// A line whose two 8-byte halves come from different steps (a 16-byte store seen half
// done) must not count as ready for either step.
TEST(LLLine, TornLineIsNotReady) {
  const uint32_t oldFlag = flagForStep(6), newFlag = flagForStep(7);
  const Line oldLine = encode(111, oldFlag), newLine = encode(222, newFlag);
  Line firstHalfNew = oldLine;
  firstHalfNew.data0 = newLine.data0;
  firstHalfNew.flag0 = newLine.flag0;
  Line secondHalfNew = oldLine;
  secondHalfNew.data1 = newLine.data1;
  secondHalfNew.flag1 = newLine.flag1;
  for (const Line& l : {firstHalfNew, secondHalfNew}) {
    EXPECT_FALSE(ready(l, newFlag));
    EXPECT_FALSE(ready(l, oldFlag));
  }
  EXPECT_FALSE(ready(Line{}, flagForStep(0)));  // a zeroed buffer is never ready
}

TEST(LLLine, StepFlagsAreNeverZeroAndConsecutiveOnesDiffer) {
  const uint64_t steps[] = {0,
                            1,
                            2,
                            0xFFFFFFFDull,
                            0xFFFFFFFEull,
                            0xFFFFFFFFull,
                            0x100000000ull,
                            0x100000001ull,
                            0x1FFFFFFFDull,
                            0x1FFFFFFFEull,
                            0x1FFFFFFFFull,
                            ~0ull - 1};
  for (uint64_t s : steps) {
    EXPECT_NE(flagForStep(s), 0u) << s;
    EXPECT_NE(flagForStep(s), flagForStep(s + 1)) << s;
  }
  EXPECT_EQ(flagForStep(0), 1u);
}

TEST(LLLine, LinesFor) {
  EXPECT_EQ(linesFor(0), 0u);
  EXPECT_EQ(linesFor(1), 1u);
  EXPECT_EQ(linesFor(8), 1u);
  EXPECT_EQ(linesFor(9), 2u);
  EXPECT_EQ(linesFor(4096), 512u);
}

// Whole messages of every small length at every alignment: pack, unpack into a poisoned
// buffer with guard bytes, compare; nothing written past the end.
TEST(LLLine, PackUnpackEveryLengthAndAlignment) {
  std::mt19937_64 rng(11);
  for (size_t bytes = 0; bytes <= 70; ++bytes) {
    for (size_t off : {0, 1, 3, 4, 7}) {
      std::vector<unsigned char> src(bytes + off), dst(bytes + off + 16, 0xCD);
      for (auto& c : src) c = static_cast<unsigned char>(rng());
      std::vector<Line> lines(linesFor(bytes) + 1);
      const uint32_t flag = flagForStep(bytes * 8 + off);
      packMessage(src.data() + off, bytes, flag, lines.data());
      ASSERT_EQ(unpackMessage(lines.data(), bytes, flag, dst.data() + off), 0u);
      ASSERT_EQ(std::memcmp(dst.data() + off, src.data() + off, bytes), 0) << bytes << " at +" << off;
      for (size_t i = 0; i < off; ++i) ASSERT_EQ(dst[i], 0xCD);
      for (size_t i = off + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xCD) << bytes << " at +" << off;
      if (bytes % kLinePayload) {  // the padding of the last line is zero
        const uint64_t last = payloadOf(lines[linesFor(bytes) - 1]);
        EXPECT_EQ(last >> (8 * (bytes % kLinePayload)), 0u);
      }
    }
  }
}

// A receiver must see exactly which lines are missing and take nothing from stale ones.
TEST(LLLine, UnpackCountsMissingAndStaleLines) {
  std::vector<unsigned char> src(100), dst(100, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  std::vector<Line> lines(linesFor(src.size()));
  const uint32_t step5 = flagForStep(5), step6 = flagForStep(6);
  packMessage(src.data(), src.size(), step5, lines.data());
  // The buffer now holds step 5; step 6 has not arrived in any line.
  EXPECT_EQ(unpackMessage(lines.data(), src.size(), step6, dst.data()), lines.size());
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 100);
  // Step 6 arrives except lines 2 and 9 (still step 5) and line 4 torn.
  std::vector<unsigned char> next(src.rbegin(), src.rend());
  std::vector<Line> newer(lines.size());
  packMessage(next.data(), next.size(), step6, newer.data());
  for (size_t i = 0; i < lines.size(); ++i)
    if (i != 2 && i != 9) lines[i] = newer[i];
  lines[4].flag1 = step5;
  EXPECT_EQ(unpackMessage(lines.data(), next.size(), step6, dst.data()), 3u);
  for (size_t i = 0; i < dst.size(); ++i) {
    const size_t line = i / kLinePayload;
    EXPECT_EQ(dst[i], (line == 2 || line == 9 || line == 4) ? 0 : next[i]) << i;
  }
}

}  // namespace
}  // namespace ridge::ll
