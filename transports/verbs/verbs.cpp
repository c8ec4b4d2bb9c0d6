// Provider-independent pieces of the verbs subset: the QP state machine both providers
// enforce, names for logs, and the provider lookup.
#include "transports/verbs/verbs.h"

namespace ridge {
namespace verbs {

// Defined by the providers (softnic always; rdma-core only in builds with libibverbs).
Status createSoftnicProvider(std::unique_ptr<Provider>* out);
#if defined(RIDGE_HAVE_VERBS)
Status createIbvProvider(std::unique_ptr<Provider>* out);
#endif

const char* qpStateName(QpState s) {
  switch (s) {
    case QpState::Reset: return "RESET";
    case QpState::Init: return "INIT";
    case QpState::Rtr: return "RTR";
    case QpState::Rts: return "RTS";
    case QpState::Error: return "ERROR";
  }
  return "?";
}

bool qpTransitionAllowed(QpState from, QpState to) {
  // Error and Reset are reachable from anywhere (teardown and recovery); otherwise only the
  // one step forward that connection setup takes.
  if (to == QpState::Error || to == QpState::Reset) return true;
  return (from == QpState::Reset && to == QpState::Init) || (from == QpState::Init && to == QpState::Rtr) ||
         (from == QpState::Rtr && to == QpState::Rts);
}

const char* cqeStatusName(uint8_t status) {
  switch (status) {
    case kCqeOk: return "success";
    case kCqeLocalLengthError: return "local length error";
    case kCqeLocalProtectionError: return "local protection error";
    case kCqeRemoteAccessError: return "remote access error";
    case kCqeRemoteInvalidRequest: return "remote invalid request";
    case kCqeTransportRetryExceeded: return "transport retry exceeded";
    case kCqeFlushed: return "flushed";
    case kCqeBadOpcode: return "bad opcode";
    case kCqeGeneralError: return "general error";
  }
  return "unknown status";
}

uint32_t roundUpPow2(uint32_t v, uint32_t* log2Out) {
  uint32_t log2 = 0;
  while ((1u << log2) < v && log2 < 31) ++log2;
  if (log2Out) *log2Out = log2;
  return 1u << log2;
}

Status ProtectionDomain::registerDmaBuf(int fd, uint64_t offset, size_t bytes, uint64_t iova, uint32_t access,
                                        std::unique_ptr<MemoryRegion>* out) {
  return makeError(ridgeInvalidUsage,
                   "verbs: dma-buf registration (GPU memory) is not implemented by this provider yet");
}

Status ProtectionDomain::createMlx5Cq(uint32_t entries, std::unique_ptr<CompletionQueue>* out) {
  return makeError(ridgeInvalidUsage, "verbs: mlx5 direct completion queues need the rdma-core provider");
}

#if !defined(RIDGE_HAVE_VERBS)
GdrLadderFacts gdrLadderFactsWithoutDevice() {
  GdrLadderFacts f;
  f.rdmaCore = FactWhy::no("this build has no rdma-core provider (RIDGE_WITH_VERBS)");
  return f;
}

GdrLadderFacts probeGdrLadder(Device* device, device::DeviceRuntime* runtime, uint64_t stagingBytes) {
  return gdrLadderFactsWithoutDevice();
}
#endif

GdrLadderFacts predictGdrLadderFacts(const std::vector<std::string>& nicOsNames, const std::string& nicModel,
                                     bool thisHost) {
  GdrLadderFacts f;
  if (thisHost) {
    f = gdrLadderFactsWithoutDevice();
  } else {
    f.rdmaCore = FactWhy::unknown("a described machine, not this host");
  }
  f.gpu = FactWhy::yes();
  f.nicMemoryProbed = false;
  if (f.directQueues.value != Fact::No) {
    bool mlx5 =
        nicModel.find("ConnectX") != std::string::npos || nicModel.find("BlueField") != std::string::npos;
    for (const std::string& n : nicOsNames) mlx5 = mlx5 || n.compare(0, 4, "mlx5") == 0;
    std::string what = nicModel;
    for (const std::string& n : nicOsNames) what += (what.empty() ? "" : " ") + n;
    if (mlx5)
      f.directQueues = FactWhy::unknown("mlx5dv_create_qp at init");
    else
      f.directQueues =
          FactWhy::no("the NIC is not an mlx5 one (" + (what.empty() ? std::string("unnamed") : what) + ")");
  }
  return f;
}

bool verbsProviderBuilt() {
#if defined(RIDGE_HAVE_VERBS)
  return true;
#else
  return false;
#endif
}

Status openProvider(const std::string& name, std::unique_ptr<Provider>* out) {
  if (name == "softnic") return createSoftnicProvider(out);
  if (name == "verbs") {
#if defined(RIDGE_HAVE_VERBS)
    return createIbvProvider(out);
#else
    return makeError(ridgeInvalidUsage,
                     "verbs: this build has no rdma-core provider (configure with RIDGE_WITH_VERBS=ON and "
                     "libibverbs-dev installed)");
#endif
  }
  return makeError(ridgeInvalidArgument, "verbs: unknown provider '%s' (softnic or verbs)", name.c_str());
}

}  // namespace verbs
}  // namespace ridge
