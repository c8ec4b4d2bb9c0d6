// Python.h first, as Python asks (it sets feature macros the standard headers read).
#include "process_group_ridge.hpp"

#include <ATen/ATen.h>
#include <Python.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <utility>

#ifdef RIDGE_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace torch_ridge {
namespace {

// The enum name of a result, so that an error names the Ridge code a user can look up.
const char* resultName(ridgeResult_t r) {
  static const char* const kNames[] = {"ridgeSuccess",       "ridgeUnhandledCudaError", "ridgeSystemError",
                                       "ridgeInternalError", "ridgeInvalidArgument",    "ridgeInvalidUsage",
                                       "ridgeRemoteError",   "ridgeInProgress",         "ridgeTimeout",
                                       "ridgeAborted"};
  return r >= 0 && r < ridgeNumResults ? kNames[r] : "ridge result out of range";
}

// Throws (a RuntimeError in Python) naming the call, the Ridge code and Ridge's own text.
// Must run on the thread that made the call: ridgeGetLastError is per thread.
void check(ridgeResult_t r, const char* call, ridgeComm_t comm) {
  if (r == ridgeSuccess) return;
  std::string detail = ridgeGetLastError(comm);
  throw std::runtime_error(std::string("ridge: ") + call + " failed with " + resultName(r) + " (" +
                           ridgeGetErrorString(r) + ")" + (detail.empty() ? "" : ": " + detail));
}

[[noreturn]] void unsupported(const std::string& what) {
  TORCH_CHECK(false, "ridge backend: ", what);
}

bool onDevice(const at::Tensor& t) {
#ifdef RIDGE_TORCH_CUDA
  if (t.is_cuda()) return true;
#endif
  return false;
}

void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "ridge backend: ", op, ": undefined tensor");
  if (t.is_cpu() || onDevice(t)) return;
  if (t.is_cuda())
    unsupported(
        std::string(op) +
        ": CUDA tensors need torch and Ridge both built with CUDA; this torch_ridge was built without "
        "(use CPU tensors)");
  unsupported(std::string(op) + ": tensors on " + t.device().str() + " are not supported (CPU" +
#ifdef RIDGE_TORCH_CUDA
              " or CUDA"
#endif
              " only)");
  TORCH_CHECK(!t.is_sparse(), "ridge backend: ", op, ": sparse tensors are not supported");
}

// Every tensor of a call on one device (all CPU, or all the same CUDA device).
bool checkTensors(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(!ts.empty(), "ridge backend: ", op, ": no tensors");
  for (const at::Tensor& t : ts) {
    checkTensor(t, op);
    TORCH_CHECK(t.device() == ts[0].device(), "ridge backend: ", op, ": tensors on different devices (",
                ts[0].device(), ", ", t.device(), ")");
  }
  return onDevice(ts[0]);
}

void checkOne(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "ridge backend: ", op,
              ": one tensor per call (torch's multi-tensor-per-process forms are not supported), got ",
              ts.size());
}

// The element type a reduction runs on. bool reduces as uint8 0/1 (see reduceOpFor).
ridgeDataType_t reduceType(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return ridgeFloat32;
    case at::kDouble: return ridgeFloat64;
    case at::kHalf: return ridgeFloat16;
    case at::kBFloat16: return ridgeBfloat16;
    case at::kInt: return ridgeInt32;
    case at::kLong: return ridgeInt64;
    case at::kChar: return ridgeInt8;
    case at::kByte: return ridgeUint8;
    case at::kBool: return ridgeUint8;
    default:
      unsupported(std::string(op) + ": Ridge cannot reduce " + std::string(c10::toString(t.scalar_type())) +
                  " (float, double, half, bfloat16, int8, uint8, int32, int64 and bool can be reduced)");
  }
}

// A reduction as Ridge runs it. PREMUL_SUM (torch's _make_nccl_premul_sum) has no Ridge
// operator in the C API used here: the input is multiplied by the factor (in its own
// dtype, on this rank) and then summed, which is what the operator means.
struct Reduction {
  ridgeRedOp_t op = ridgeSum;
  bool premul = false;
  double factor = 1.0;
  at::Tensor factorTensor;  // defined when the factor was given as a tensor
};

Reduction reductionFor(const c10d::ReduceOp& rop, const at::Tensor& t, const char* op) {
  Reduction r;
  const bool isBool = t.scalar_type() == at::kBool;
  switch (rop.op_) {
    // bool: sum and max are "any" (max of 0/1), product and min are "all", as NCCL's
    // backend maps them; AVG of bools means nothing.
    case c10d::ReduceOp::SUM: r.op = isBool ? ridgeMax : ridgeSum; break;
    case c10d::ReduceOp::PRODUCT: r.op = isBool ? ridgeMin : ridgeProd; break;
    case c10d::ReduceOp::MIN: r.op = ridgeMin; break;
    case c10d::ReduceOp::MAX: r.op = ridgeMax; break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!isBool, "ridge backend: ", op, ": AVG of bool tensors is not defined");
      r.op = ridgeAvg;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(!isBool, "ridge backend: ", op, ": PREMUL_SUM of bool tensors is not defined");
      auto* supplement = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(supplement, "ridge backend: ", op, ": PREMUL_SUM without its factor");
      r.op = ridgeSum;
      r.premul = true;
      if (!supplement->tensor_factors.empty()) {
        TORCH_CHECK(supplement->tensor_factors.size() == 1, "ridge backend: ", op,
                    ": PREMUL_SUM with one factor per tensor: one tensor, one factor");
        r.factorTensor = supplement->tensor_factors[0];
      } else {
        r.factor = supplement->double_factor;
      }
      break;
    }
    default:
      unsupported(
          std::string(op) +
          ": Ridge has no bitwise reductions (BAND, BOR, BXOR); it has SUM, PRODUCT, MIN, MAX, AVG and "
          "PREMUL_SUM");
  }
  return r;
}

// Scales `buf` in place by the PREMUL_SUM factor (no-op for other operators).
void applyPremul(const Reduction& r, at::Tensor& buf) {
  if (!r.premul) return;
  if (r.factorTensor.defined())
    buf.mul_(r.factorTensor.to(buf.device(), buf.scalar_type()));
  else
    buf.mul_(r.factor);
}

size_t bytesOf(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// A contiguous tensor that Ridge may read or write in place of the caller's: the tensor
// itself when it is contiguous, else a contiguous copy (written back by writeBack).
at::Tensor staged(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

void writeBack(at::Tensor& user, const at::Tensor& buf) {
  if (!user.is_same(buf)) user.copy_(buf);
}

ridgeStream_t streamOf(const at::Tensor& t) {
#ifdef RIDGE_TORCH_CUDA
  if (t.is_cuda())
    return reinterpret_cast<ridgeStream_t>(at::cuda::getCurrentCUDAStream(t.device().index()).stream());
#endif
  return nullptr;
}

// Copies block `b` of `count` rows of `src` (dim 0) into `dst`.
void copyRows(at::Tensor& dst, int64_t dstRow, const at::Tensor& src, int64_t srcRow, int64_t rows) {
  if (rows > 0) dst.narrow(0, dstRow, rows).copy_(src.narrow(0, srcRow, rows));
}

// gather's outputs and scatter's inputs: on the root one list of `size` tensors shaped like
// `like` (its numel and dtype), elsewhere nothing. Returns the root's list (or none).
std::vector<at::Tensor> rootOnlyList(const std::vector<std::vector<at::Tensor>>& lists,
                                     const at::Tensor& like, bool isRoot, int size, const char* op,
                                     const char* what) {
  if (!isRoot) {
    TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), "ridge backend: ", op,
                ": only the root passes ", what, " tensors");
    return {};
  }
  TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == size, "ridge backend: ", op,
              ": the root needs one list of ", size, " ", what, " tensors");
  checkTensors(lists[0], op);
  for (const at::Tensor& t : lists[0])
    TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(), "ridge backend: ", op,
                ": every ", what, " must have the size and dtype of this rank's tensor");
  return lists[0];
}

// RAII ridgeGroupStart/End so that an exception between them still closes the group
// (the group's error, if any, is then the one thrown).
class RidgeGroup {
 public:
  explicit RidgeGroup(ridgeComm_t comm) : comm_(comm) {
    check(ridgeGroupStart(), "ridgeGroupStart", nullptr);
  }
  void end() {
    open_ = false;
    check(ridgeGroupEnd(), "ridgeGroupEnd", comm_);
  }
  ~RidgeGroup() {
    if (open_) ridgeGroupEnd();
  }

 private:
  ridgeComm_t comm_;
  bool open_ = true;
};

}  // namespace

// ---- RidgeWork ---------------------------------------------------------------------------

RidgeWork::RidgeWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, bool device)
    : c10d::Work(rank, type), outputs_(std::move(outputs)) {
  auto type_ = c10::ListType::create(c10::TensorType::get());
#ifdef RIDGE_TORCH_CUDA
  if (device && !outputs_.empty()) {
    // A CUDA-aware future: markCompleted records an event on the current stream, and
    // value()/then() users wait on it instead of on the host.
    future_ = c10::make_intrusive<c10::ivalue::Future>(type_, std::vector<c10::Device>{outputs_[0].device()});
    // Constructed on the caller's thread: its current stream is the one the operation goes on.
    stream_ = at::cuda::getCurrentCUDAStream(outputs_[0].device().index());
    return;
  }
#endif
  future_ = c10::make_intrusive<c10::ivalue::Future>(type_);
}

void RidgeWork::complete(std::exception_ptr error) {
  // The future first: whoever returns from wait() may read it at once.
#ifdef RIDGE_TORCH_CUDA
  // A CUDA future records its events on the current stream: make that the operation's.
  c10::optional<c10::cuda::CUDAStreamGuard> onStream;
  if (stream_) onStream.emplace(*stream_);
#endif
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
  finish(error);
}

void RidgeWork::synchronize() {
#ifdef RIDGE_TORCH_CUDA
  // Makes the current streams wait for the events the future recorded.
  if (future_->completed() && !future_->hasError()) future_->wait();
#endif
}

// ---- ProcessGroupRidge -------------------------------------------------------------------

ProcessGroupRidge::ProcessGroupRidge(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : RidgeBase(rank, size) {
  TORCH_CHECK(store, "ridge backend: no store");
  // Each process group has a store of its own (torch prefixes it with the group's name),
  // but a name can come back (destroy_process_group, then init again on the same store).
  // So every creation is numbered: each rank adds 1 to a counter, and the k-th creation
  // of this group on any rank sees a value in (k*size, (k+1)*size]. No rank can add for
  // creation k+1 before every rank added for k, since creation k waits for all of them.
  const int64_t joined = store->add("ridge/joined", 1);
  const std::string key = "ridge/unique_id/" + std::to_string((joined - 1) / size);
  ridgeUniqueId id;
  if (rank == 0) {
    // The id names an ephemeral port of a root listener Ridge opens here; MASTER_PORT
    // stays torch's store's.
    check(ridgeGetUniqueId(&id), "ridgeGetUniqueId", nullptr);
    store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    store->wait({key}, timeout);
    std::vector<uint8_t> bytes = store->get(key);
    TORCH_CHECK(bytes.size() == sizeof(id.internal), "ridge backend: the unique id in the store has ",
                bytes.size(), " bytes, not ", sizeof(id.internal));
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  ridgeConfig_t config = RIDGE_CONFIG_INITIALIZER;
  // torch's timeout bounds every wait for a peer, unless RIDGE_TIMEOUT says otherwise.
  const char* env = std::getenv("RIDGE_TIMEOUT");
  if (!(env && *env)) {
    const int64_t seconds = (timeout.count() + 999) / 1000;
    config.timeoutSeconds = static_cast<int>(std::clamp<int64_t>(seconds, 1, INT_MAX));
  }
  config.commName = "torch";
  check(ridgeCommInitRankConfig(&comm_, size, id, rank, &config), "ridgeCommInitRankConfig", nullptr);
  worker_ = std::thread([this] { workerLoop(); });
}

ProcessGroupRidge::~ProcessGroupRidge() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  // Operations already issued still run (each bounded by the communicator's timeout).
  // The worker may drop the last reference to a tensor that has a Python object, which
  // takes the GIL: a Python thread dropping the group must not hold it while waiting.
  if (worker_.joinable()) {
    PyThreadState* saved = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
    worker_.join();
    if (saved) PyEval_RestoreThread(saved);
  }
  // Not ridgeCommFinalize: it is collective, and ranks drop their groups at different times.
  if (comm_) ridgeCommDestroy(comm_);
}

void ProcessGroupRidge::workerLoop() {
  // In-place copies into tensors that require grad (a parameter broadcast by the user) are
  // not autograd operations; grad mode is per thread.
  at::NoGradGuard noGrad;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      task.run();
    } catch (...) {
      error = std::current_exception();
    }
    task.work->complete(error);
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                          bool device, std::function<void()> run) {
  auto work = c10::make_intrusive<RidgeWork>(rank_, type, std::move(outputs), device);
  Task task{std::move(run), work};
  if (coalescing_) {
    coalesced_.push_back(std::move(task));
    return work;
  }
#ifdef RIDGE_TORCH_CUDA
  if (device) {
    // The caller's stream must have the operation on it when this returns; the worker
    // only enqueues it there (stream-ordered), so wait for that, not for the data.
    auto enqueued = std::make_shared<std::promise<void>>();
    std::future<void> done = enqueued->get_future();
    auto inner = std::move(task.run);
    task.run = [inner = std::move(inner), enqueued] {
      try {
        inner();
      } catch (...) {
        enqueued->set_value();
        throw;
      }
      enqueued->set_value();
    };
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    done.wait();
    return work;
  }
#endif
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
  return work;
}

void ProcessGroupRidge::startCoalescing() {
  TORCH_CHECK(!coalescing_, "ridge backend: startCoalescing while already coalescing");
  coalescing_ = true;
}

void ProcessGroupRidge::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& /*works*/) {
  TORCH_CHECK(coalescing_, "ridge backend: endCoalescing without startCoalescing");
  coalescing_ = false;
  std::vector<Task> tasks = std::move(coalesced_);
  coalesced_.clear();
  if (tasks.empty()) return;
  // One task runs them all inside one Ridge group; each operation's body issues its
  // Ridge calls, which the group only queues, so copies that must follow the data are
  // deferred by the operations themselves (see deferAfterGroup).
  auto works = std::make_shared<std::vector<c10::intrusive_ptr<RidgeWork>>>();
  auto runs = std::make_shared<std::vector<std::function<void()>>>();
  for (Task& t : tasks) {
    works->push_back(t.work);
    runs->push_back(std::move(t.run));
  }
  auto batchWork =
      c10::make_intrusive<RidgeWork>(rank_, c10d::OpType::UNKNOWN, std::vector<at::Tensor>{}, false);
  Task batch{[this, works, runs] {
               std::exception_ptr error;
               try {
                 afterGroup_.clear();
                 inGroup_ = true;
                 RidgeGroup group(comm_);
                 for (auto& run : *runs) run();
                 inGroup_ = false;
                 group.end();
                 for (auto& after : afterGroup_) after();
               } catch (...) {
                 error = std::current_exception();
               }
               inGroup_ = false;
               afterGroup_.clear();
               for (auto& w : *works) w->complete(error);
               if (error) std::rethrow_exception(error);
             },
             batchWork};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(batch));
  }
  wake_.notify_one();
}

void ProcessGroupRidge::deferAfterGroup(std::function<void()> after) {
  if (inGroup_)
    afterGroup_.push_back(std::move(after));
  else
    after();
}

// ---- collectives -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  checkOne(tensors, "allreduce");
  const bool device = checkTensors(tensors, "allreduce");
  at::Tensor t = tensors[0];
  const ridgeDataType_t dt = reduceType(t, "allreduce");
  const Reduction red = reductionFor(opts.reduceOp, t, "allreduce");
  const ridgeStream_t stream = streamOf(t);
  return enqueue(c10d::OpType::ALLREDUCE, tensors, device, [this, t, dt, red, stream]() mutable {
    if (t.numel() == 0) return;
    at::Tensor buf = staged(t);
    applyPremul(red, buf);
    check(ridgeAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, red.op, comm_, stream),
          "ridgeAllReduce", comm_);
    deferAfterGroup([t, buf]() mutable { writeBack(t, buf); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const bool device = checkTensors(tensors, "allreduce_coalesced");
  std::vector<ridgeDataType_t> types;
  std::vector<Reduction> reds;
  for (const at::Tensor& t : tensors) {
    types.push_back(reduceType(t, "allreduce_coalesced"));
    reds.push_back(reductionFor(opts.reduceOp, t, "allreduce_coalesced"));
  }
  const ridgeStream_t stream = streamOf(tensors[0]);
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, device,
                 [this, tensors, types, reds, stream]() mutable {
                   // One Ridge group: the reductions progress together.
                   std::vector<at::Tensor> bufs;
                   RidgeGroup group(comm_);
                   for (size_t i = 0; i < tensors.size(); ++i) {
                     bufs.push_back(staged(tensors[i]));
                     if (tensors[i].numel() == 0) continue;
                     applyPremul(reds[i], bufs[i]);
                     check(ridgeAllReduce(bufs[i].data_ptr(), bufs[i].data_ptr(), bufs[i].numel(), types[i],
                                          reds[i].op, comm_, stream),
                           "ridgeAllReduce", comm_);
                   }
                   group.end();
                   deferAfterGroup([tensors, bufs]() mutable {
                     for (size_t i = 0; i < tensors.size(); ++i) writeBack(tensors[i], bufs[i]);
                   });
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  checkOne(tensors, "broadcast");
  const bool device = checkTensors(tensors, "broadcast");
  TORCH_CHECK(opts.rootTensor == 0, "ridge backend: broadcast: rootTensor must be 0");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "ridge backend: broadcast: root ", opts.rootRank,
              " is out of range [0, ", size_, ")");
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  const ridgeStream_t stream = streamOf(t);
  return enqueue(c10d::OpType::BROADCAST, tensors, device, [this, t, root, stream]() mutable {
    if (t.numel() == 0) return;
    at::Tensor buf = staged(t);
    // Moved as bytes: every dtype (bool, complex, ...) can be broadcast.
    check(ridgeBroadcast(buf.data_ptr(), buf.data_ptr(), bytesOf(buf), ridgeUint8, root, comm_, stream),
          "ridgeBroadcast", comm_);
    deferAfterGroup([t, buf]() mutable { writeBack(t, buf); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  checkOne(tensors, "reduce");
  const bool device = checkTensors(tensors, "reduce");
  TORCH_CHECK(opts.rootTensor == 0, "ridge backend: reduce: rootTensor must be 0");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "ridge backend: reduce: root ", opts.rootRank,
              " is out of range [0, ", size_, ")");
  at::Tensor t = tensors[0];
  const ridgeDataType_t dt = reduceType(t, "reduce");
  const Reduction red = reductionFor(opts.reduceOp, t, "reduce");
  const int root = static_cast<int>(opts.rootRank);
  const ridgeStream_t stream = streamOf(t);
  return enqueue(c10d::OpType::REDUCE, tensors, device, [this, t, dt, red, root, stream]() mutable {
    if (t.numel() == 0) return;
    // PREMUL_SUM scales a copy: the input of a non-root rank is not an output.
    at::Tensor buf = red.premul ? t.clone(at::MemoryFormat::Contiguous) : staged(t);
    applyPremul(red, buf);
    check(ridgeReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), dt, red.op, root, comm_, stream),
          "ridgeReduce", comm_);
    if (rank_ == root) deferAfterGroup([t, buf]() mutable { writeBack(t, buf); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& /*opts*/) {
  checkOne(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "ridge backend: allgather: one output list per call, got ",
              outputs.size());
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_, "ridge backend: allgather: ", outputs[0].size(),
              " output tensors for ", size_, " ranks");
  const bool device = checkTensors(inputs, "allgather");
  checkTensors(outputs[0], "allgather");
  at::Tensor in = inputs[0];
  for (const at::Tensor& o : outputs[0])
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type() && o.device() == in.device(),
                "ridge backend: allgather: every output must have the input's size, dtype and device");
  std::vector<at::Tensor> outs = outputs[0];
  const ridgeStream_t stream = streamOf(in);
  return enqueue(c10d::OpType::ALLGATHER, outs, device, [this, in, outs, stream]() mutable {
    if (in.numel() == 0) return;
    at::Tensor src = staged(in);
    at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
    check(ridgeAllGather(src.data_ptr(), flat.data_ptr(), bytesOf(src), ridgeUint8, comm_, stream),
          "ridgeAllGather", comm_);
    deferAfterGroup([outs, flat, n = in.numel()]() mutable {
      for (size_t i = 0; i < outs.size(); ++i) outs[i].copy_(flat.narrow(0, i * n, n).view(outs[i].sizes()));
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& /*opts*/) {
  const bool device = checkTensors({output, input}, "_allgather_base");
  TORCH_CHECK(output.numel() == input.numel() * size_, "ridge backend: _allgather_base: output has ",
              output.numel(), " elements, not ", size_, " x ", input.numel());
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ridge backend: _allgather_base: dtypes differ");
  at::Tensor out = output, in = input;
  const ridgeStream_t stream = streamOf(in);
  return enqueue(c10d::OpType::_ALLGATHER_BASE, {output}, device, [this, out, in, stream]() mutable {
    if (in.numel() == 0) return;
    at::Tensor dst = staged(out);
    // An input that is this rank's block of the output is read in place by Ridge; a
    // staged copy of the output must then get the input copied into it first.
    at::Tensor src = staged(in);
    check(ridgeAllGather(src.data_ptr(), dst.data_ptr(), bytesOf(src), ridgeUint8, comm_, stream),
          "ridgeAllGather", comm_);
    deferAfterGroup([out, dst]() mutable { writeBack(out, dst); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  // torch's layout: outputLists[r][i] receives rank r's inputs[i].
  const bool device = checkTensors(inputs, "allgather_coalesced");
  TORCH_CHECK(static_cast<int>(outputLists.size()) == size_,
              "ridge backend: allgather_coalesced: ", outputLists.size(), " output lists for ", size_,
              " ranks");
  std::vector<at::Tensor> flatOuts;
  for (auto& list : outputLists) {
    TORCH_CHECK(list.size() == inputs.size(), "ridge backend: allgather_coalesced: each output list needs ",
                inputs.size(), " tensors");
    checkTensors(list, "allgather_coalesced");
    for (size_t i = 0; i < list.size(); ++i)
      TORCH_CHECK(list[i].numel() == inputs[i].numel() && list[i].scalar_type() == inputs[i].scalar_type(),
                  "ridge backend: allgather_coalesced: output ", i, " does not match input ", i);
    flatOuts.insert(flatOuts.end(), list.begin(), list.end());
  }
  auto lists = outputLists;
  std::vector<at::Tensor> ins = inputs;
  const ridgeStream_t stream = streamOf(inputs[0]);
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, flatOuts, device, [this, lists, ins, stream]() mutable {
    std::vector<at::Tensor> flats(ins.size());
    std::vector<at::Tensor> srcs(ins.size());
    RidgeGroup group(comm_);
    for (size_t i = 0; i < ins.size(); ++i) {
      if (ins[i].numel() == 0) continue;
      srcs[i] = staged(ins[i]);
      flats[i] = at::empty({static_cast<int64_t>(size_) * ins[i].numel()}, ins[i].options());
      check(ridgeAllGather(srcs[i].data_ptr(), flats[i].data_ptr(), bytesOf(srcs[i]), ridgeUint8, comm_,
                           stream),
            "ridgeAllGather", comm_);
    }
    group.end();
    deferAfterGroup([lists, flats, ins, srcs]() mutable {
      for (size_t i = 0; i < ins.size(); ++i) {
        if (!flats[i].defined()) continue;
        const int64_t n = ins[i].numel();
        for (size_t r = 0; r < lists.size(); ++r)
          lists[r][i].copy_(flats[i].narrow(0, r * n, n).view(lists[r][i].sizes()));
      }
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  checkOne(inputs, "gather");
  const bool device = checkTensors(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "ridge backend: gather: root ", root, " is out of range");
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = rootOnlyList(outputs, in, rank_ == root, size_, "gather", "output");
  const ridgeStream_t stream = streamOf(in);
  return enqueue(c10d::OpType::GATHER, outs, device, [this, in, outs, root, stream]() mutable {
    if (in.numel() == 0) return;
    at::Tensor src = staged(in);
    std::vector<at::Tensor> bufs(outs.size());
    RidgeGroup group(comm_);
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        if (r == root) continue;
        bufs[r] = staged(outs[r]);
        check(ridgeRecv(bufs[r].data_ptr(), bytesOf(bufs[r]), ridgeUint8, r, comm_, stream), "ridgeRecv",
              comm_);
      }
    } else {
      check(ridgeSend(src.data_ptr(), bytesOf(src), ridgeUint8, root, comm_, stream), "ridgeSend", comm_);
    }
    group.end();
    deferAfterGroup([this, outs, bufs, src, root]() mutable {
      if (rank_ != root) return;
      for (int r = 0; r < size_; ++r) {
        if (r == root)
          outs[r].copy_(src.view(outs[r].sizes()));
        else
          writeBack(outs[r], bufs[r]);
      }
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  checkOne(outputs, "scatter");
  const bool device = checkTensors(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "ridge backend: scatter: root ", root, " is out of range");
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = rootOnlyList(inputs, out, rank_ == root, size_, "scatter", "input");
  const ridgeStream_t stream = streamOf(out);
  return enqueue(c10d::OpType::SCATTER, outputs, device, [this, out, ins, root, stream]() mutable {
    if (out.numel() == 0) return;
    at::Tensor dst = staged(out);
    std::vector<at::Tensor> srcs(ins.size());
    RidgeGroup group(comm_);
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        srcs[r] = staged(ins[r]);
        if (r != root)
          check(ridgeSend(srcs[r].data_ptr(), bytesOf(srcs[r]), ridgeUint8, r, comm_, stream), "ridgeSend",
                comm_);
      }
    } else {
      check(ridgeRecv(dst.data_ptr(), bytesOf(dst), ridgeUint8, root, comm_, stream), "ridgeRecv", comm_);
    }
    group.end();
    deferAfterGroup([this, out, dst, srcs, root]() mutable {
      if (rank_ == root)
        out.copy_(srcs[root].view(out.sizes()));
      else
        writeBack(out, dst);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  checkOne(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "ridge backend: reduce_scatter: one list of ", size_, " input tensors");
  const bool device = checkTensors(outputs, "reduce_scatter");
  checkTensors(inputs[0], "reduce_scatter");
  at::Tensor out = outputs[0];
  for (const at::Tensor& i : inputs[0])
    TORCH_CHECK(
        i.numel() == out.numel() && i.scalar_type() == out.scalar_type() && i.device() == out.device(),
        "ridge backend: reduce_scatter: every input must have the output's size, dtype and device");
  const ridgeDataType_t dt = reduceType(out, "reduce_scatter");
  const Reduction red = reductionFor(opts.reduceOp, out, "reduce_scatter");
  std::vector<at::Tensor> ins = inputs[0];
  const ridgeStream_t stream = streamOf(out);
  return enqueue(c10d::OpType::REDUCE_SCATTER, outputs, device, [this, out, ins, dt, red, stream]() mutable {
    if (out.numel() == 0) return;
    std::vector<at::Tensor> flatIns;
    for (const at::Tensor& i : ins) flatIns.push_back(i.reshape({-1}));
    at::Tensor flat = at::cat(flatIns);  // a new tensor: PREMUL_SUM may scale it
    applyPremul(red, flat);
    at::Tensor dst = staged(out);
    check(ridgeReduceScatter(flat.data_ptr(), dst.data_ptr(), dst.numel(), dt, red.op, comm_, stream),
          "ridgeReduceScatter", comm_);
    deferAfterGroup([out, dst, flat]() mutable { writeBack(out, dst); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const bool device = checkTensors({output, input}, "_reduce_scatter_base");
  TORCH_CHECK(input.numel() == output.numel() * size_, "ridge backend: _reduce_scatter_base: input has ",
              input.numel(), " elements, not ", size_, " x ", output.numel());
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "ridge backend: _reduce_scatter_base: dtypes differ");
  const ridgeDataType_t dt = reduceType(output, "_reduce_scatter_base");
  const Reduction red = reductionFor(opts.reduceOp, output, "_reduce_scatter_base");
  at::Tensor out = output, in = input;
  const ridgeStream_t stream = streamOf(out);
  return enqueue(
      c10d::OpType::_REDUCE_SCATTER_BASE, {output}, device, [this, out, in, dt, red, stream]() mutable {
        if (out.numel() == 0) return;
        at::Tensor src = red.premul ? in.clone(at::MemoryFormat::Contiguous) : staged(in);
        applyPremul(red, src);
        at::Tensor dst = staged(out);
        check(ridgeReduceScatter(src.data_ptr(), dst.data_ptr(), dst.numel(), dt, red.op, comm_, stream),
              "ridgeReduceScatter", comm_);
        deferAfterGroup([out, dst, src]() mutable { writeBack(out, dst); });
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& outputSplitSizes,
                                                                std::vector<int64_t>& inputSplitSizes,
                                                                const c10d::AllToAllOptions& /*opts*/) {
  const bool device = checkTensors({output, input}, "alltoall_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "ridge backend: alltoall_base: dtypes differ");
  at::Tensor out = output, in = input;
  const ridgeStream_t stream = streamOf(in);
  if (outputSplitSizes.empty() && inputSplitSizes.empty()) {
    TORCH_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0, "ridge backend: alltoall_base: input (",
                in.numel(), ") and output (", out.numel(), ") must be equal and divisible by ", size_);
    return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, device, [this, out, in, stream]() mutable {
      if (in.numel() == 0) return;
      at::Tensor src = staged(in), dst = staged(out);
      check(ridgeAlltoAll(src.data_ptr(), dst.data_ptr(), bytesOf(src) / size_, ridgeUint8, comm_, stream),
            "ridgeAlltoAll", comm_);
      deferAfterGroup([out, dst, src]() mutable { writeBack(out, dst); });
    });
  }
  // Split sizes count rows of dim 0; an empty list means equal rows per rank.
  TORCH_CHECK(in.dim() >= 1 && out.dim() >= 1, "ridge backend: alltoall_base: split sizes need a dim 0");
  auto splits = [&](const std::vector<int64_t>& given, const at::Tensor& t, const char* which) {
    std::vector<int64_t> s = given;
    if (s.empty()) {
      TORCH_CHECK(t.size(0) % size_ == 0, "ridge backend: alltoall_base: ", which, " dim 0 (", t.size(0),
                  ") is not divisible by ", size_);
      s.assign(size_, t.size(0) / size_);
    }
    TORCH_CHECK(static_cast<int>(s.size()) == size_, "ridge backend: alltoall_base: ", s.size(), " ", which,
                " split sizes for ", size_, " ranks");
    int64_t sum = 0;
    for (int64_t v : s) {
      TORCH_CHECK(v >= 0, "ridge backend: alltoall_base: negative split size");
      sum += v;
    }
    TORCH_CHECK(sum == t.size(0), "ridge backend: alltoall_base: ", which, " split sizes add up to ", sum,
                ", dim 0 is ", t.size(0));
    return s;
  };
  std::vector<int64_t> inRows = splits(inputSplitSizes, in, "input");
  std::vector<int64_t> outRows = splits(outputSplitSizes, out, "output");
  TORCH_CHECK(in.size(0) == 0 || out.size(0) == 0 || in.numel() / in.size(0) == out.numel() / out.size(0),
              "ridge backend: alltoall_base: input and output rows differ in size");
  return enqueue(
      c10d::OpType::ALLTOALL_BASE, {output}, device, [this, out, in, inRows, outRows, stream]() mutable {
        at::Tensor src = staged(in), dst = staged(out);
        const size_t inRowBytes = in.size(0) ? bytesOf(src) / in.size(0) : 0;
        const size_t outRowBytes = out.size(0) ? bytesOf(dst) / out.size(0) : 0;
        auto* srcBytes = static_cast<const char*>(src.data_ptr());
        auto* dstBytes = static_cast<char*>(dst.data_ptr());
        int64_t inRow = 0, outRow = 0, selfIn = 0, selfOut = 0;
        RidgeGroup group(comm_);
        for (int peer = 0; peer < size_; ++peer) {
          if (peer == rank_) {
            selfIn = inRow;
            selfOut = outRow;
          } else {
            // Zero-row blocks are skipped on both sides: the splits agree pairwise.
            if (inRows[peer] > 0)
              check(ridgeSend(srcBytes + inRow * inRowBytes, inRows[peer] * inRowBytes, ridgeUint8, peer,
                              comm_, stream),
                    "ridgeSend", comm_);
            if (outRows[peer] > 0)
              check(ridgeRecv(dstBytes + outRow * outRowBytes, outRows[peer] * outRowBytes, ridgeUint8, peer,
                              comm_, stream),
                    "ridgeRecv", comm_);
          }
          inRow += inRows[peer];
          outRow += outRows[peer];
        }
        group.end();
        TORCH_CHECK(inRows[rank_] == outRows[rank_], "ridge backend: alltoall_base: this rank sends itself ",
                    inRows[rank_], " rows but expects ", outRows[rank_]);
        deferAfterGroup([out, dst, src, selfIn, selfOut, rows = inRows[rank_]]() mutable {
          copyRows(dst, selfOut, src, selfIn, rows);
          writeBack(out, dst);
        });
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& /*opts*/) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
              "ridge backend: alltoall: one input and one output tensor per rank");
  const bool device = checkTensors(inputs, "alltoall");
  checkTensors(outputs, "alltoall");
  TORCH_CHECK(inputs[rank_].numel() == outputs[rank_].numel(),
              "ridge backend: alltoall: this rank's own input and output blocks differ in size");
  std::vector<at::Tensor> outs = outputs, ins = inputs;
  const ridgeStream_t stream = streamOf(inputs[0]);
  return enqueue(c10d::OpType::ALLTOALL, outputs, device, [this, outs, ins, stream]() mutable {
    std::vector<at::Tensor> srcs(size_), dsts(size_);
    RidgeGroup group(comm_);
    for (int peer = 0; peer < size_; ++peer) {
      srcs[peer] = staged(ins[peer]);
      dsts[peer] = staged(outs[peer]);
      if (peer == rank_) continue;
      if (srcs[peer].numel() > 0)
        check(ridgeSend(srcs[peer].data_ptr(), bytesOf(srcs[peer]), ridgeUint8, peer, comm_, stream),
              "ridgeSend", comm_);
      if (dsts[peer].numel() > 0)
        check(ridgeRecv(dsts[peer].data_ptr(), bytesOf(dsts[peer]), ridgeUint8, peer, comm_, stream),
              "ridgeRecv", comm_);
    }
    group.end();
    deferAfterGroup([this, outs, srcs, dsts]() mutable {
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_)
          outs[peer].copy_(srcs[peer].view(outs[peer].sizes()));
        else
          writeBack(outs[peer], dsts[peer]);
      }
    });
  });
}

// Tags are not matched: Ridge pairs a rank's sends to a peer with that peer's receives from
// it in issue order. As NCCL's, a send outside batch_isend_irecv completes when the peer
// has received it, so two ranks must not both send first to each other unless batched.
c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                       int /*tag*/) {
  checkOne(tensors, "send");
  const bool device = checkTensors(tensors, "send");
  TORCH_CHECK(dstRank >= 0 && dstRank < size_ && dstRank != rank_, "ridge backend: send: peer ", dstRank,
              " is not another rank of the group");
  at::Tensor t = tensors[0];
  const ridgeStream_t stream = streamOf(t);
  return enqueue(c10d::OpType::SEND, {}, device, [this, t, dstRank, stream]() mutable {
    if (t.numel() == 0) return;
    at::Tensor src = staged(t);
    check(ridgeSend(src.data_ptr(), bytesOf(src), ridgeUint8, dstRank, comm_, stream), "ridgeSend", comm_);
    deferAfterGroup([src] {});  // keeps the staged copy alive until the group has run
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                       int /*tag*/) {
  checkOne(tensors, "recv");
  const bool device = checkTensors(tensors, "recv");
  TORCH_CHECK(srcRank >= 0 && srcRank < size_ && srcRank != rank_, "ridge backend: recv: peer ", srcRank,
              " is not another rank of the group");
  at::Tensor t = tensors[0];
  const ridgeStream_t stream = streamOf(t);
  return enqueue(c10d::OpType::RECV, tensors, device, [this, t, srcRank, stream]() mutable {
    if (t.numel() == 0) return;
    at::Tensor dst = staged(t);
    check(ridgeRecv(dst.data_ptr(), bytesOf(dst), ridgeUint8, srcRank, comm_, stream), "ridgeRecv", comm_);
    deferAfterGroup([t, dst]() mutable { writeBack(t, dst); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::recvAnysource(std::vector<at::Tensor>& /*tensors*/,
                                                                int /*tag*/) {
  unsupported(
      "recv from any source is not supported: ridgeRecv needs the peer's rank (Ridge would answer "
      "ridgeInvalidArgument); pass src= to recv/irecv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRidge::barrier(const c10d::BarrierOptions& /*opts*/) {
  // Ridge has no barrier call: a one-byte allreduce has every rank wait for every other,
  // and runs after everything issued before it (the queue is in order).
  at::Tensor token = at::zeros({1}, at::kByte);
  return enqueue(c10d::OpType::BARRIER, {}, false, [this, token]() mutable {
    check(ridgeAllReduce(token.data_ptr(), token.data_ptr(), 1, ridgeUint8, ridgeMax, comm_, nullptr),
          "ridgeAllReduce (barrier)", comm_);
  });
}

}  // namespace torch_ridge
