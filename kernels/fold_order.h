// Which rank's input starts the fold of a reduced element on the device paths, shared by the
// bulk P2P engine (src/coll/device/p2p.cpp) and the LL collectives (kernels/ll_collective.h) so
// that both give the same bits: float sums depend on the order of their operands.
//
// P2P cuts an allreduce into one slice per rank (each rank reduces its slice from every
// rank's input, its own first, then copies it to the peers); reduce-scatter and reduce are
// reduced by the rank that owns the output. The fold then runs over the ranks in the
// order owner, owner + 1, ..., owner - 1 (mod n), in rounds of at most kFoldSources
// sources (the reduce kernel's limit; a later round folds the previous result first).
// RIDGE_HOST_DEVICE: the LL kernel calls these on the GPU.
#pragma once

#include <cstddef>

#include "core/host_device.h"

namespace ridge {

// Sources of one reduce-kernel launch (kernels/device_reduce.h); a fold over more ranks runs
// in rounds.
constexpr int kFoldSources = 8;

// Rank k's allreduce slice starts at element sliceStart(count, es, k, P) (k = P: the end).
// Cut at whole 16-byte vectors, so that a slice of buffers that start 16-byte aligned starts
// aligned too and the reduce kernel can take its vector path (an even share per rank would
// leave every slice but the first misaligned whenever count is not a multiple of 16 / es * P).
RIDGE_HOST_DEVICE inline size_t allReduceSliceStart(size_t count, size_t es, int k, int P) {
  if (k >= P) return count;
  const size_t perVector = 16 / es;  // every element size divides 16
  return count * size_t(k) / size_t(P) / perVector * perVector;
}

// The rank whose allreduce slice holds element `elem`.
RIDGE_HOST_DEVICE inline int allReduceSliceOwner(size_t count, size_t es, size_t elem, int P) {
  int k = 0;
  while (k + 1 < P && allReduceSliceStart(count, es, k + 1, P) <= elem) ++k;
  return k;
}

}  // namespace ridge
