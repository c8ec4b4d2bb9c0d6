// How a bulk launch with channels (kernels/device_reduce.h, LaunchShape) cuts its buffer:
// the grid plan the host computes and the slice each channel's blocks work on. Plain C++
// callable from host and device code, so the host test (tests/gpu/test_channel_partition.cpp,
// every build) proves on the CPU the very arithmetic the kernels run: every element falls in
// exactly one channel's slice, for every (count, channels, blocks per channel, element size).
//
// Units: the plan counts work units (16-byte vectors on the vector path, elements or bytes on
// the scalar path); a slice is asked for in the units the kernel indexes (elements for the
// reduction, whose tail elements do not fill a vector, vectors for the copy). The last
// channel's slice always runs to the end of the buffer: that is where the elements after the
// last whole vector belong (they once fell outside every slice when the vectors divided evenly
// among the channels: a double reduction of 5 elements on 3 channels lost its fifth element).
#pragma once

#include <cstddef>

#include "core/host_device.h"

namespace ridge::gpu {

/// Most channels one launch is cut into.
constexpr int kMaxChannels = 64;

/// The grid of one launch: `channels` groups of `blocksPerChannel` blocks; channel c owns
/// units [c * perSlice, (c + 1) * perSlice) (the last one: to the end).
struct ChannelPlan {
  int channels;
  int blocksPerChannel;
  size_t perSlice;  // units per channel slice; at least 1
};

/// The plan for `units` work units. channels <= 0: the single-channel form, whose grid fills
/// the device (`fillBlocks`), capped by `maxBlocks` when > 0 and by the `threads`-wide strips
/// there are. Otherwise channels (clamped to kMaxChannels) and blocksPerChannel (0: the
/// filling grid shared out over the channels), with never an empty channel and never more
/// blocks per channel than the slice has strips.
RIDGE_HOST_DEVICE inline ChannelPlan planChannels(size_t units, int channels, int blocksPerChannel,
                                                  int maxBlocks, int fillBlocks, int threads) {
  const size_t strips = (units + threads - 1) / threads;
  if (channels <= 0) {
    size_t blocks = strips < static_cast<size_t>(fillBlocks) ? strips : static_cast<size_t>(fillBlocks);
    if (maxBlocks > 0 && blocks > static_cast<size_t>(maxBlocks)) blocks = static_cast<size_t>(maxBlocks);
    return {1, blocks < 1 ? 1 : static_cast<int>(blocks), units > 0 ? units : 1};
  }
  size_t ch = static_cast<size_t>(channels < kMaxChannels ? channels : kMaxChannels);
  if (ch > units) ch = units > 0 ? units : 1;
  const size_t perSlice = units > 0 ? (units + ch - 1) / ch : 1;
  // Rounding the slice up can leave trailing channels with nothing (5 units on 4 channels:
  // slices of 2 fill 3 channels); they are dropped rather than launched idle.
  if (units > 0) ch = (units + perSlice - 1) / perSlice;
  size_t bpc =
      blocksPerChannel > 0 ? static_cast<size_t>(blocksPerChannel) : static_cast<size_t>(fillBlocks) / ch;
  const size_t useful = (perSlice + threads - 1) / threads;  // more blocks than this would idle
  if (bpc > useful) bpc = useful;
  if (bpc < 1) bpc = 1;
  return {static_cast<int>(ch), static_cast<int>(bpc), perSlice};
}

/// [begin, end) of channel `channel` of `channels`, in the kernel's units: `perSlice` of them
/// per channel (the plan's perSlice times the units per plan unit), `total` in the buffer.
/// The last channel takes everything from its begin to `total`.
struct SliceRange {
  size_t begin, end;
};
RIDGE_HOST_DEVICE inline SliceRange channelRange(size_t channel, int channels, size_t total,
                                                 size_t perSlice) {
  const size_t begin = channel * perSlice < total ? channel * perSlice : total;
  if (channel + 1 >= static_cast<size_t>(channels)) return {begin, total};
  const size_t end = total - begin > perSlice ? begin + perSlice : total;
  return {begin, end};
}

}  // namespace ridge::gpu
