// Loading rdma-core at run time (ibv_api.h). The wrappers below do what the header's inline
// verbs do, through the context ops, and call exported functions only through the table, so
// that libridge has no undefined ibv_* or mlx5dv_* symbol (tests/verbs checks the ELF).
#include "transports/verbs/ibv_api.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace ridge {
namespace verbs {
namespace {

std::mutex gMutex;
std::string gIbverbsName = "libibverbs.so.1";
std::string gMlx5Name = "libmlx5.so.1";
bool gTried = false;
Status gLoadStatus = Status::ok();
IbvApi gLoaded;
const IbvApi* gOverride = nullptr;

// ---- wrappers of inline verbs (see ibv_api.h) ----

int queryDeviceExViaOps(ibv_context* ctx, ibv_device_attr_ex* attr) {
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_device_ex);
  if (vctx) {
    const int rc = vctx->query_device_ex(ctx, nullptr, attr, sizeof(*attr));
    if (rc != EOPNOTSUPP && rc != ENOSYS) return rc;
  }
  // Old providers: the basic attributes only (no max_dm_size: reported as 0).
  std::memset(attr, 0, sizeof(*attr));
  return gLoaded.queryDevice(ctx, &attr->orig_attr);
}

int queryPortViaOps(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx) return vctx->query_port(ctx, port, attr, sizeof(*attr));
  std::memset(attr, 0, sizeof(*attr));
  return gLoaded.queryPortCompat(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

ibv_dm* allocDmViaOps(ibv_context* ctx, ibv_alloc_dm_attr* attr) {
  verbs_context* vctx = verbs_get_ctx_op(ctx, alloc_dm);
  if (!vctx) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return vctx->alloc_dm(ctx, attr);
}

int freeDmViaOps(ibv_dm* dm) {
  verbs_context* vctx = verbs_get_ctx_op(dm->context, free_dm);
  return vctx ? vctx->free_dm(dm) : EOPNOTSUPP;
}

ibv_mr* regDmMrViaOps(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned access) {
  verbs_context* vctx = verbs_get_ctx_op(pd->context, reg_dm_mr);
  if (!vctx) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return vctx->reg_dm_mr(pd, dm, offset, length, access);
}

int memcpyToDmViaOps(ibv_dm* dm, uint64_t offset, const void* src, size_t bytes) {
  return dm->memcpy_to_dm(dm, offset, src, bytes);
}

int memcpyFromDmViaOps(void* dst, ibv_dm* dm, uint64_t offset, size_t bytes) {
  return dm->memcpy_from_dm(dst, dm, offset, bytes);
}

int postSendViaOps(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}

int postRecvViaOps(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return qp->context->ops.post_recv(qp, wr, bad);
}

int pollCqViaOps(ibv_cq* cq, int n, ibv_wc* wc) {
  return cq->context->ops.poll_cq(cq, n, wc);
}

int reqNotifyCqViaOps(ibv_cq* cq, int solicitedOnly) {
  return cq->context->ops.req_notify_cq(cq, solicitedOnly);
}

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!*out && missing->empty()) *missing = name;
  return *out != nullptr;
}

Status load(IbvApi* api) {
  void* lib = dlopen(gIbverbsName.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    return makeError(ridgeSystemError,
                     "verbs: rdma-core not found: cannot load %s (%s); install rdma-core's libibverbs1 (and "
                     "the NIC's provider, e.g. ibverbs-providers) or use RIDGE_NET=socket|softnic",
                     gIbverbsName.c_str(), err ? err : "unknown error");
  }
  std::string missing;
  resolve(lib, "ibv_get_device_list", &api->getDeviceList, &missing);
  resolve(lib, "ibv_free_device_list", &api->freeDeviceList, &missing);
  resolve(lib, "ibv_get_device_name", &api->getDeviceName, &missing);
  resolve(lib, "ibv_open_device", &api->openDevice, &missing);
  resolve(lib, "ibv_close_device", &api->closeDevice, &missing);
  resolve(lib, "ibv_query_device", &api->queryDevice, &missing);
  resolve(lib, "ibv_query_gid", &api->queryGid, &missing);
  resolve(lib, "ibv_query_port", &api->queryPortCompat, &missing);
  resolve(lib, "ibv_alloc_pd", &api->allocPd, &missing);
  resolve(lib, "ibv_dealloc_pd", &api->deallocPd, &missing);
  resolve(lib, "ibv_reg_mr", &api->regMr, &missing);
  resolve(lib, "ibv_dereg_mr", &api->deregMr, &missing);
  resolve(lib, "ibv_create_comp_channel", &api->createCompChannel, &missing);
  resolve(lib, "ibv_destroy_comp_channel", &api->destroyCompChannel, &missing);
  resolve(lib, "ibv_create_cq", &api->createCq, &missing);
  resolve(lib, "ibv_destroy_cq", &api->destroyCq, &missing);
  resolve(lib, "ibv_get_cq_event", &api->getCqEvent, &missing);
  resolve(lib, "ibv_ack_cq_events", &api->ackCqEvents, &missing);
  resolve(lib, "ibv_create_qp", &api->createQp, &missing);
  resolve(lib, "ibv_destroy_qp", &api->destroyQp, &missing);
  resolve(lib, "ibv_modify_qp", &api->modifyQp, &missing);
  if (!missing.empty()) {
    dlclose(lib);
    return makeError(ridgeSystemError, "verbs: rdma-core not found: %s lacks %s (rdma-core too old?)",
                     gIbverbsName.c_str(), missing.c_str());
  }
  std::string optional;
  resolve(lib, "ibv_reg_dmabuf_mr", &api->regDmabufMr, &optional);
  api->queryDeviceEx = queryDeviceExViaOps;
  api->queryPort = queryPortViaOps;
  api->allocDm = allocDmViaOps;
  api->freeDm = freeDmViaOps;
  api->regDmMr = regDmMrViaOps;
  api->memcpyToDm = memcpyToDmViaOps;
  api->memcpyFromDm = memcpyFromDmViaOps;
  api->postSend = postSendViaOps;
  api->postRecv = postRecvViaOps;
  api->pollCq = pollCqViaOps;
  api->reqNotifyCq = reqNotifyCqViaOps;
  // Both libraries stay loaded for the life of the process (rdma-core objects may outlive any
  // one communicator, and providers do not support being unloaded).
#if defined(RIDGE_HAVE_MLX5DV)
  void* mlx5 = dlopen(gMlx5Name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!mlx5) {
    const char* err = dlerror();
    api->mlx5Missing = format("cannot load %s (%s)", gMlx5Name.c_str(), err ? err : "unknown error");
  } else {
    std::string mlx5MissingSymbol;
    resolve(mlx5, "mlx5dv_is_supported", &api->mlx5IsSupported, &mlx5MissingSymbol);
    resolve(mlx5, "mlx5dv_init_obj", &api->mlx5InitObj, &mlx5MissingSymbol);
    resolve(mlx5, "mlx5dv_create_qp", &api->mlx5CreateQp, &mlx5MissingSymbol);
    resolve(mlx5, "mlx5dv_create_cq", &api->mlx5CreateCq, &mlx5MissingSymbol);
    if (!mlx5MissingSymbol.empty()) {
      api->mlx5Missing = format("%s lacks %s", gMlx5Name.c_str(), mlx5MissingSymbol.c_str());
      api->mlx5IsSupported = nullptr;
      api->mlx5InitObj = nullptr;
      api->mlx5CreateQp = nullptr;
      api->mlx5CreateCq = nullptr;
    }
  }
#else
  api->mlx5Missing = "this build has no infiniband/mlx5dv.h";
#endif
  return Status::ok();
}

}  // namespace

Status ibvApi(const IbvApi** out) {
  std::lock_guard<std::mutex> g(gMutex);
  if (gOverride) {
    *out = gOverride;
    return Status::ok();
  }
  if (!gTried) {
    gTried = true;
    // Loaded into a fresh table first: a failed load leaves the previous one intact.
    IbvApi fresh;
    gLoadStatus = load(&fresh);
    if (gLoadStatus.isOk()) gLoaded = fresh;
  }
  *out = gLoadStatus.isOk() ? &gLoaded : nullptr;
  return gLoadStatus;
}

void setIbvLibraryNamesForTesting(const std::string& ibverbs, const std::string& mlx5) {
  std::lock_guard<std::mutex> g(gMutex);
  gIbverbsName = ibverbs;
  gMlx5Name = mlx5;
  gTried = false;
}

ScopedIbvApiForTesting::ScopedIbvApiForTesting(const IbvApi* api) {
  std::lock_guard<std::mutex> g(gMutex);
  previous_ = gOverride;
  gOverride = api;
}

ScopedIbvApiForTesting::~ScopedIbvApiForTesting() {
  std::lock_guard<std::mutex> g(gMutex);
  gOverride = previous_;
}

}  // namespace verbs
}  // namespace ridge
