// The channel partition of the bulk kernels (kernels/channel_partition.h) as host code: runs
// in every build, GPU or not. The kernels call the same two functions, so what is proved here
// is what they run: over every element size, count, channel shape and grid limit, each
// element falls in exactly one channel's slice, slices other than the last are whole 16-byte
// vectors (the vector path's alignment), no channel is empty and the grid is within bounds.
// The first GPU run (docs/gpu.md, "First GPU run") found a double reduction of 5 elements on
// 3 channels leaving its fifth element unwritten: the case that broke is in the sweep.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/channel_partition.h"

namespace {

using ridge::gpu::ChannelPlan;
using ridge::gpu::channelRange;
using ridge::gpu::kMaxChannels;
using ridge::gpu::planChannels;

constexpr int kThreads = 512;  // the bulk kernels' block size (kernels/device_reduce.cu)

struct Shape {
  int channels, blocksPerChannel, maxBlocks, fillBlocks;
};

// Checks one launch the way the launchers make it: the plan over the vectors (or elements),
// the kernel's slices over the elements. Returns "" or what went wrong.
std::string checkLaunch(size_t count, size_t elemBytes, bool vectorPath, const Shape& sh) {
  const size_t perVec = 16 / elemBytes;
  const size_t units = vectorPath ? count / perVec : count;
  const ChannelPlan p =
      planChannels(units, sh.channels, sh.blocksPerChannel, sh.maxBlocks, sh.fillBlocks, kThreads);
  const std::string where = "count " + std::to_string(count) + " elem " + std::to_string(elemBytes) +
                            " vec " + std::to_string(vectorPath) + " channels " +
                            std::to_string(sh.channels) + " bpc " + std::to_string(sh.blocksPerChannel) +
                            " maxBlocks " + std::to_string(sh.maxBlocks) + " fill " +
                            std::to_string(sh.fillBlocks) + ": ";
  if (p.channels < 1 || p.channels > kMaxChannels) return where + "channels " + std::to_string(p.channels);
  if (sh.channels > 0 && p.channels > sh.channels) return where + "more channels than asked";
  if (p.blocksPerChannel < 1) return where + "no block";
  if (p.perSlice < 1) return where + "empty slice size";
  const size_t strips = (p.perSlice + kThreads - 1) / kThreads;
  if (static_cast<size_t>(p.blocksPerChannel) > (strips > 1 ? strips : 1))
    return where + std::to_string(p.blocksPerChannel) + " blocks per channel for " + std::to_string(strips) +
           " strips";
  if (sh.channels <= 0 && sh.maxBlocks > 0 && p.blocksPerChannel > sh.maxBlocks)
    return where + "over maxBlocks";
  // The launchers' slice size in elements: the single-channel form passes the whole count.
  const size_t perSliceElems = p.channels == 1 ? count : vectorPath ? p.perSlice * perVec : p.perSlice;
  std::vector<unsigned char> covered(count, 0);
  for (int c = 0; c < p.channels; ++c) {
    const auto r = channelRange(static_cast<size_t>(c), p.channels, count, perSliceElems);
    if (r.begin > r.end || r.end > count) return where + "channel " + std::to_string(c) + " out of range";
    if (count > 0 && r.begin == r.end) return where + "channel " + std::to_string(c) + " is empty";
    if (vectorPath && r.begin % perVec != 0)
      return where + "channel " + std::to_string(c) + " not vector-aligned";
    for (size_t i = r.begin; i < r.end; ++i) ++covered[i];
  }
  for (size_t i = 0; i < count; ++i)
    if (covered[i] != 1)
      return where + "element " + std::to_string(i) + " covered " + std::to_string(covered[i]) + " times";
  return "";
}

TEST(ChannelPartition, EveryElementInExactlyOneSliceForEveryShape) {
  std::vector<size_t> counts;
  for (size_t c = 0; c <= 300; ++c) counts.push_back(c);
  for (size_t c : {size_t{1000}, size_t{4097}, size_t{8192}, size_t{100003}, size_t{262144}})
    counts.push_back(c);
  const int channels[] = {0, 1, 2, 3, 4, 5, 7, 8, 13, 63, 64, 65, 200};
  size_t checked = 0;
  for (size_t elem : {size_t{1}, size_t{2}, size_t{4}, size_t{8}})
    for (size_t count : counts)
      for (int ch : channels)
        for (int bpc : {0, 1, 2, 3})
          for (int maxBlocks : {0, 2})
            for (int fill : {4, 528})
              for (bool vec : {true, false}) {
                if (ch > 0 && maxBlocks > 0) continue;  // maxBlocks is the single-channel form's
                if (ch <= 0 && bpc > 0) continue;       // and blocksPerChannel the channel form's
                const std::string err = checkLaunch(count, elem, vec, {ch, bpc, maxBlocks, fill});
                ASSERT_EQ(err, "");
                ++checked;
              }
  EXPECT_GT(checked, 100000u);
}

// The case the first GPU run failed on, spelled out: 5 doubles are 2 whole vectors and one
// tail element; 3 channels become 2 of one vector each, and the last runs to element 5.
TEST(ChannelPartition, TailElementsBelongToTheLastChannel) {
  const ChannelPlan p = planChannels(5 / 2, 3, 0, 0, 528, kThreads);
  ASSERT_EQ(p.channels, 2);
  ASSERT_EQ(p.perSlice, 1u);
  const auto first = channelRange(0, p.channels, 5, p.perSlice * 2);
  const auto last = channelRange(1, p.channels, 5, p.perSlice * 2);
  EXPECT_EQ(first.begin, 0u);
  EXPECT_EQ(first.end, 2u);
  EXPECT_EQ(last.begin, 2u);
  EXPECT_EQ(last.end, 5u);
}

// Channels that rounding would leave empty are not planned: 5 units on 4 channels are
// slices of 2 on 3 channels.
TEST(ChannelPartition, NoEmptyChannels) {
  const ChannelPlan p = planChannels(5, 4, 1, 0, 528, kThreads);
  EXPECT_EQ(p.channels, 3);
  EXPECT_EQ(p.perSlice, 2u);
}

}  // namespace
