// The c10d backend "ridge": torch.distributed collectives on a Ridge communicator.
//
// torch 1.x: ProcessGroupRidge is a c10d::ProcessGroup. torch 2.x split the process group
// into a ProcessGroup front and per-device c10d::Backend objects with the same collective
// methods; there it derives from c10d::Backend (the switch below; only the 1.x side is
// compiled on the machines this was written on, which have Debian's torch 1.13).
//
// Execution: Ridge calls on host memory complete before they return, so each process group
// owns one worker thread that runs its operations in the order they were issued (the
// order every rank issues them in, which Ridge needs), and every call returns at once with
// a RidgeWork that the worker completes. CUDA tensors (where both torch and Ridge have
// CUDA) go through the same queue: the worker enqueues them on the caller's current stream
// and the caller waits only for that enqueue, so later work on its stream is ordered after.
#pragma once

#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif
#ifndef TORCH_VERSION_MAJOR
// Debian's libtorch-dev has no torch/version.h: CMake passes the version it found.
#define TORCH_VERSION_MAJOR RIDGE_TORCH_VERSION_MAJOR
#endif

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <ridge/ridge.h>

#ifdef RIDGE_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace torch_ridge {

#if TORCH_VERSION_MAJOR >= 2
using RidgeBase = c10d::Backend;
#else
using RidgeBase = c10d::ProcessGroup;
#endif

// One operation of a process group: done (or failed) when the worker has run it.
class RidgeWork : public c10d::Work {
 public:
  RidgeWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, bool onDevice);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  // CUDA: makes the caller's current stream wait for the operation (no-op on CPU).
  void synchronize() override;

  // Called once by the worker: completes the Work and its future (with the outputs, or
  // with the error).
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
#ifdef RIDGE_TORCH_CUDA
  c10::optional<c10::cuda::CUDAStream> stream_;  // the stream a CUDA operation runs on
#endif
};

class ProcessGroupRidge : public RidgeBase {
 public:
  // Collective over the ranks of the group: rank 0 makes a Ridge unique id and puts it in
  // `store` (torch's per-group PrefixStore), the others read it, and all create the
  // communicator. `timeout` bounds that and every later wait for a peer.
  ProcessGroupRidge(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout);
  ~ProcessGroupRidge() override;

  const std::string getBackendName() const override { return "ridge"; }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // batch_isend_irecv and torch's coalescing manager: the operations issued between the
  // two run as one Ridge group (ridgeGroupStart/End), so sends and receives between the
  // same ranks do not wait on each other.
  void startCoalescing() override;
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& works) override;

  // The communicator, for tests and for callers that want Ridge's own calls on it.
  ridgeComm_t comm() const { return comm_; }

 private:
  struct Task {
    std::function<void()> run;
    c10::intrusive_ptr<RidgeWork> work;
  };

  // Queues `run` on the worker; outputs become the Work's result and future value.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, bool onDevice,
                                         std::function<void()> run);
  void workerLoop();
  // Runs `after` now, or, while the worker runs a coalesced batch inside one Ridge group,
  // once that group has ended (the data exists only then): copies out of staging buffers.
  void deferAfterGroup(std::function<void()> after);

  ridgeComm_t comm_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  // Coalescing: operations collected between startCoalescing and endCoalescing.
  bool coalescing_ = false;
  std::vector<Task> coalesced_;
  // Worker thread only: inside a coalesced batch, and what runs after its group.
  bool inGroup_ = false;
  std::vector<std::function<void()>> afterGroup_;
  std::thread worker_;
};

}  // namespace torch_ridge
