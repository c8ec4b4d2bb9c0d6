// rdma-core, loaded at run time: every libibverbs and libmlx5 function the rdma-core provider
// calls, in one table. libridge does not link either library (no DT_NEEDED), so it loads on
// hosts without rdma-core; RIDGE_NET=verbs then fails with "rdma-core not found" and every
// other transport works.
//
// Many verbs are static inline in <infiniband/verbs.h> and go through the context's ops
// (ibv_post_send, ibv_poll_cq, ibv_alloc_dm, ibv_query_device_ex, ...): they need no symbol,
// but some fall back to an exported one (ibv_query_device_ex to ibv_query_device,
// ibv_query_port to the compat ibv_query_port) and ibv_reg_mr is a macro choosing between
// ibv_reg_mr and ibv_reg_mr_iova2. So the provider never calls a verbs name directly: the
// table's entries for inline verbs are Ridge's own wrappers that do what the inline does
// without referencing a symbol, and the entries for exported verbs are dlsym'd. Tests
// replace the whole table with doubles (ScopedIbvApiForTesting), through the same calls.
//
// Only built where <infiniband/verbs.h> exists (RIDGE_HAVE_VERBS).
#pragma once

#include <infiniband/verbs.h>

#include <string>

#if defined(RIDGE_HAVE_MLX5DV)
#include <infiniband/mlx5dv.h>
#endif

#include "core/status.h"

namespace ridge {
namespace verbs {

struct IbvApi {
  // ---- libibverbs exports (dlsym) ----
  decltype(&::ibv_get_device_list) getDeviceList = nullptr;
  decltype(&::ibv_free_device_list) freeDeviceList = nullptr;
  decltype(&::ibv_get_device_name) getDeviceName = nullptr;
  decltype(&::ibv_open_device) openDevice = nullptr;
  decltype(&::ibv_close_device) closeDevice = nullptr;
  decltype(&::ibv_query_device) queryDevice = nullptr;
  decltype(&::ibv_query_gid) queryGid = nullptr;
  // The exported ibv_query_port takes the old, shorter attribute struct; queryPort below uses
  // the context op with the full one and falls back to this.
  decltype(&::ibv_query_port) queryPortCompat = nullptr;
  decltype(&::ibv_alloc_pd) allocPd = nullptr;
  decltype(&::ibv_dealloc_pd) deallocPd = nullptr;
  decltype(&::ibv_dereg_mr) deregMr = nullptr;
  decltype(&::ibv_create_comp_channel) createCompChannel = nullptr;
  decltype(&::ibv_destroy_comp_channel) destroyCompChannel = nullptr;
  decltype(&::ibv_create_cq) createCq = nullptr;
  decltype(&::ibv_destroy_cq) destroyCq = nullptr;
  decltype(&::ibv_get_cq_event) getCqEvent = nullptr;
  decltype(&::ibv_ack_cq_events) ackCqEvents = nullptr;
  decltype(&::ibv_create_qp) createQp = nullptr;
  decltype(&::ibv_destroy_qp) destroyQp = nullptr;
  decltype(&::ibv_modify_qp) modifyQp = nullptr;
  // The plain exported ibv_reg_mr (the header's macro picks it for constant access flags
  // without optional ones; Ridge's flags are never optional ones).
  ibv_mr* (*regMr)(ibv_pd*, void*, size_t, int) = nullptr;
  // Optional (rdma-core 34 and later): null where the library lacks it.
  decltype(&::ibv_reg_dmabuf_mr) regDmabufMr = nullptr;

  // ---- inline verbs: Ridge's wrappers over the context ops (see the top of this file) ----
  int (*queryDeviceEx)(ibv_context*, ibv_device_attr_ex*) = nullptr;
  int (*queryPort)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
  ibv_dm* (*allocDm)(ibv_context*, ibv_alloc_dm_attr*) = nullptr;
  int (*freeDm)(ibv_dm*) = nullptr;
  ibv_mr* (*regDmMr)(ibv_pd*, ibv_dm*, uint64_t, size_t, unsigned) = nullptr;
  int (*memcpyToDm)(ibv_dm*, uint64_t, const void*, size_t) = nullptr;
  int (*memcpyFromDm)(void*, ibv_dm*, uint64_t, size_t) = nullptr;
  int (*postSend)(ibv_qp*, ibv_send_wr*, ibv_send_wr**) = nullptr;
  int (*postRecv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**) = nullptr;
  int (*pollCq)(ibv_cq*, int, ibv_wc*) = nullptr;
  int (*reqNotifyCq)(ibv_cq*, int) = nullptr;

  // ---- libmlx5 (mlx5 direct verbs), all null when libmlx5.so.1 is missing ----
  std::string mlx5Missing;  // why the mlx5 entries are null ("" when loaded)
#if defined(RIDGE_HAVE_MLX5DV)
  decltype(&::mlx5dv_is_supported) mlx5IsSupported = nullptr;
  decltype(&::mlx5dv_init_obj) mlx5InitObj = nullptr;
  decltype(&::mlx5dv_create_qp) mlx5CreateQp = nullptr;
  decltype(&::mlx5dv_create_cq) mlx5CreateCq = nullptr;
#endif
  bool hasMlx5() const {
#if defined(RIDGE_HAVE_MLX5DV)
    return mlx5IsSupported && mlx5InitObj && mlx5CreateQp && mlx5CreateCq;
#else
    return false;
#endif
  }
};

// The process's table: libibverbs.so.1 (and libmlx5.so.1, optional) loaded on the first call,
// or the table a test installed. Loading is tried once; a failure is remembered and every call
// returns it: ridgeSystemError "verbs: rdma-core not found: <dlerror>" (or the missing symbol).
Status ibvApi(const IbvApi** out);

// For tests: the file names dlopen tries (defaults "libibverbs.so.1", "libmlx5.so.1"); forgets a
// previous load result so that the next ibvApi() tries these. Not thread-safe against users.
void setIbvLibraryNamesForTesting(const std::string& ibverbs, const std::string& mlx5);

// For tests: ibvApi() returns `api` (test doubles) for the scope.
class ScopedIbvApiForTesting {
 public:
  explicit ScopedIbvApiForTesting(const IbvApi* api);
  ~ScopedIbvApiForTesting();
  ScopedIbvApiForTesting(const ScopedIbvApiForTesting&) = delete;
  ScopedIbvApiForTesting& operator=(const ScopedIbvApiForTesting&) = delete;

 private:
  const IbvApi* previous_;
};

}  // namespace verbs
}  // namespace ridge
