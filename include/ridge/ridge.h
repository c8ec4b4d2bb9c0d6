/*
 * Ridge: a topology-aware collective communication library.
 *
 * This is the whole public C ABI. It is shaped like NCCL's so that code written for
 * NCCL ports by renaming: opaque communicators created from a unique id, collectives
 * that take (send, recv, count, datatype, op, comm, stream) and return a result code,
 * group calls that fuse point-to-point operations, and an error string per code.
 *
 * Every call validates its arguments and returns a result code; on failure the text
 * of ridgeGetLastError() says which argument was wrong and why. No call aborts the
 * process, and a peer that dies or never arrives turns into ridgeRemoteError or
 * ridgeTimeout within RIDGE_TIMEOUT seconds instead of a hang.
 *
 * Memory: buffers are host memory, or (CUDA builds, with a device) device or managed
 * memory of the communicator's device; one call's buffers must not mix the two. The
 * stream argument is typed so that CUDA code passes a cudaStream_t without a cast.
 * Calls on host memory complete before they return (or, inside a group, before
 * ridgeGroupEnd returns); a non-NULL stream is synchronized first. Calls on device
 * memory are stream-ordered, as NCCL's: they enqueue on the stream (NULL: the legacy
 * default stream) and return; work queued later on the stream sees the result, and an
 * error after the call returned is reported by ridgeCommGetAsyncError (the stream is
 * still released). See docs/gpu.md.
 */
#ifndef RIDGE_RIDGE_H
#define RIDGE_RIDGE_H

#include <stddef.h>
#include <stdint.h>

#include "ridge/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Symbol visibility: the shared library exports only what this header declares. */
#if defined(_WIN32)
#define RIDGE_API
#else
#define RIDGE_API __attribute__((visibility("default")))
#endif

/**
 * A CUDA stream. Declared as the same incomplete struct pointer as cudaStream_t so
 * that a cudaStream_t converts implicitly and no CUDA header is needed to include
 * this one. Pass NULL for host memory.
 */
typedef struct CUstream_st* ridgeStream_t;

/** Opaque communicator handle: one per rank per group of ranks. */
typedef struct ridgeComm* ridgeComm_t;

/** Result codes. Values of the first eight match NCCL's so wrappers can map them 1:1. */
typedef enum {
  ridgeSuccess = 0,            /**< The call did what it was asked. */
  ridgeUnhandledCudaError = 1, /**< A CUDA call failed (CUDA builds only). */
  ridgeSystemError = 2,        /**< An operating-system call failed (socket, mmap, ...). */
  ridgeInternalError = 3,      /**< A bug in Ridge: please report it with the last-error text. */
  ridgeInvalidArgument = 4,    /**< An argument is out of range: null pointer, bad type, root, ... */
  ridgeInvalidUsage = 5,       /**< Valid arguments in an invalid order or state. */
  ridgeRemoteError = 6,        /**< A peer failed, closed its connection or died. */
  ridgeInProgress = 7,         /**< A non-blocking operation has not finished yet. */
  ridgeTimeout = 8,            /**< A peer did not answer within RIDGE_TIMEOUT. */
  ridgeAborted = 9,            /**< The communicator was aborted with ridgeCommAbort. */
  ridgeNumResults = 10
} ridgeResult_t;

/** Element types. Values match NCCL's ncclDataType_t. */
typedef enum {
  ridgeInt8 = 0,
  ridgeChar = 0,
  ridgeUint8 = 1,
  ridgeInt32 = 2,
  ridgeInt = 2,
  ridgeUint32 = 3,
  ridgeInt64 = 4,
  ridgeUint64 = 5,
  ridgeFloat16 = 6, /**< IEEE 754 binary16; reductions accumulate in float32. */
  ridgeHalf = 6,
  ridgeFloat32 = 7,
  ridgeFloat = 7,
  ridgeFloat64 = 8,
  ridgeDouble = 8,
  ridgeBfloat16 = 9, /**< bfloat16; reductions accumulate in float32. */
  ridgeNumTypes = 10
} ridgeDataType_t;

/** Reduction operators. Values match NCCL's ncclRedOp_t. */
typedef enum {
  ridgeSum = 0,
  ridgeProd = 1,
  ridgeMax = 2,
  ridgeMin = 3,
  ridgeAvg = 4, /**< Sum divided by the rank count; integers divide with truncation. */
  /** The built-in operators' count, and the first value of the operators that
   *  ridgeRedOpCreatePreMulSum creates (one table per communicator). */
  ridgeNumOps = 5,
  ridgeMaxRedOp = 0x7fffffff /**< Largest value an operator handle may take (keeps the enum int-sized). */
} ridgeRedOp_t;

/** Where the scalar of ridgeRedOpCreatePreMulSum lives and when it is read (NCCL's values). */
typedef enum {
  /** The pointer stays valid and is read by every collective that uses the operator, when
   *  it runs (device memory of the communicator's device, or host memory). */
  ridgeScalarDevice = 0,
  /** Host memory, read once before ridgeRedOpCreatePreMulSum returns. */
  ridgeScalarHostImmediate = 1
} ridgeScalarResidence_t;

/** The color that leaves a rank out of every communicator of ridgeCommSplit. */
#define RIDGE_SPLIT_NOCOLOR (-1)

/** Flags of ridgeCommShrink (NCCL's values). */
#define RIDGE_SHRINK_DEFAULT 0x00 /**< The parent has no operation in flight. */
#define RIDGE_SHRINK_ABORT 0x01   /**< Abort the parent's operations in flight first (a rank died in one). */

/** Size of the unique id in bytes (the same as NCCL's). */
#define RIDGE_UNIQUE_ID_BYTES 128

/**
 * Rendezvous token. Created once by ridgeGetUniqueId on one process, copied to every
 * rank by the caller (MPI_Bcast, a file, a key-value store), and passed to
 * ridgeCommInitRank. It carries the root's socket address.
 */
typedef struct {
  char internal[RIDGE_UNIQUE_ID_BYTES];
} ridgeUniqueId;

/** Marks a config field as "use the default". */
#define RIDGE_CONFIG_UNDEF_INT INT32_MIN

/**
 * Options for ridgeCommInitRankConfig. Always start from RIDGE_CONFIG_INITIALIZER:
 * the first three fields let later releases grow the struct without breaking callers.
 */
typedef struct ridgeConfig_v1 {
  size_t size;          /**< sizeof(ridgeConfig_t), set by the initializer. */
  unsigned int magic;   /**< RIDGE_CONFIG_MAGIC, set by the initializer. */
  unsigned int version; /**< RIDGE_VERSION_CODE at compile time, set by the initializer. */
  /** 1 (default): init returns when the communicator is ready. 0: init returns
   *  ridgeInProgress at once; poll ridgeCommGetAsyncError until it is not ridgeInProgress. */
  int blocking;
  /** Seconds a rank waits for a peer before failing with ridgeTimeout; overrides
   *  RIDGE_TIMEOUT for this communicator. */
  int timeoutSeconds;
  /** Name printed in log lines; may be NULL. */
  const char* commName;
} ridgeConfig_t;

#define RIDGE_CONFIG_MAGIC 0x52494447u /* "RIDG" */

/** Initializer for ridgeConfig_t: every option at its default. */
#define RIDGE_CONFIG_INITIALIZER                                                           \
  {                                                                                        \
    sizeof(ridgeConfig_t), RIDGE_CONFIG_MAGIC, RIDGE_VERSION_CODE, RIDGE_CONFIG_UNDEF_INT, \
        RIDGE_CONFIG_UNDEF_INT, NULL                                                       \
  }

/** Writes the library version as major*10000 + minor*100 + patch. */
RIDGE_API ridgeResult_t ridgeGetVersion(int* version);

/**
 * Creates a unique id on this process and starts the rendezvous service that the
 * ranks will connect to. Call it on exactly one process per communicator. The
 * service listens on RIDGE_SOCKET_IFNAME (or the first non-loopback interface that
 * is up, loopback as last resort) and lives until every rank has joined.
 */
RIDGE_API ridgeResult_t ridgeGetUniqueId(ridgeUniqueId* uniqueId);

/**
 * Creates the communicator of rank `rank` among `nranks` ranks. Collective: every
 * rank must call it with the same id. Blocks until all ranks joined and transports
 * are connected, or fails with ridgeTimeout after RIDGE_TIMEOUT.
 */
RIDGE_API ridgeResult_t ridgeCommInitRank(ridgeComm_t* comm, int nranks, ridgeUniqueId commId, int rank);

/**
 * As ridgeCommInitRank, with options. With config->blocking == 0 it returns
 * ridgeInProgress and finishes in the background; *comm is valid at once but may only
 * be passed to ridgeCommGetAsyncError, ridgeCommAbort or ridgeCommDestroy until that
 * reports ridgeSuccess.
 */
RIDGE_API ridgeResult_t ridgeCommInitRankConfig(ridgeComm_t* comm, int nranks, ridgeUniqueId commId, int rank,
                                                ridgeConfig_t* config);

/**
 * Creates a communicator from the environment, for launchers: rank 0 listens on
 * RIDGE_ROOT_ADDR (host:port; else MASTER_ADDR and MASTER_PORT) and the others connect.
 * Rank and world size come as a pair from the first of RIDGE_RANK/RIDGE_WORLD_SIZE,
 * RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (mpirun),
 * PMI_RANK/PMI_SIZE (PMI launchers) and SLURM_PROCID/SLURM_NTASKS (srun). Ranks that
 * disagree on the world size fail with a message saying so.
 */
RIDGE_API ridgeResult_t ridgeCommInitFromEnv(ridgeComm_t* comm);

/**
 * Creates `ndev` communicators of one process, rank i in comms[i], for a program that drives
 * several ranks from one thread (each rank then needs its own thread or a group around its
 * calls, as with NCCL). devlist[i] is the CUDA device of rank i (NULL: 0..ndev-1); in a
 * process without a CUDA device the devices are not used and devlist must be NULL or hold
 * values >= 0. The ranks connect on threads of their own; the call returns when all are
 * ready, or frees them all and fails.
 */
RIDGE_API ridgeResult_t ridgeCommInitAll(ridgeComm_t* comms, int ndev, const int* devlist);

/**
 * Splits `comm`: the ranks that pass the same `color` form one new communicator, ordered by
 * `key` (ties by rank in comm). A rank passing RIDGE_SPLIT_NOCOLOR takes part but gets
 * *newcomm = NULL. Collective over comm: every rank must call it (nothing of comm may be in
 * flight). config as for ridgeCommInitRankConfig (NULL: blocking, comm's timeout); with
 * config->blocking == 0 the new communicators finish connecting in the background and the
 * call returns ridgeInProgress. Each new communicator bootstraps through a unique id
 * created by its first rank and passed to the others through comm's own connections.
 */
RIDGE_API ridgeResult_t ridgeCommSplit(ridgeComm_t comm, int color, int key, ridgeComm_t* newcomm,
                                       ridgeConfig_t* config);

/**
 * Creates a communicator of the ranks of `comm` that are not in excludeRanks (ranks that died,
 * hang or are simply left out): they keep their order, so new rank = old rank minus the
 * excluded ranks below it. Collective over the surviving ranks only: each passes the same set
 * (in any order), and they call it within comm's timeout of one another; an excluded rank must
 * not call it, and nothing waits on one. Works on a communicator broken by an error.
 * RIDGE_SHRINK_DEFAULT: nothing may be in flight on comm (a call blocked on another thread is
 * ridgeInvalidUsage); a healthy comm's queued device operations finish first. RIDGE_SHRINK_ABORT:
 * comm's operations in flight are aborted first (a call blocked on another thread returns
 * ridgeAborted, queued device operations are dropped) and comm stays aborted: only
 * ridgeCommDestroy or ridgeCommAbort, which then wait on no peer. The survivors meet through
 * comm's bootstrap connections between themselves: each tells the lowest survivor its set; once
 * all have come (it waits twice comm's timeout) and agree, that survivor creates the new
 * communicator's unique id and hands it out. Survivors that disagree all fail with
 * ridgeInvalidUsage naming both sets; one that never comes makes the others fail with
 * ridgeTimeout (then shrink again without it). The new communicator's transports are built
 * between the survivors only. config as for ridgeCommSplit (NULL: blocking, comm's timeout).
 */
RIDGE_API ridgeResult_t ridgeCommShrink(ridgeComm_t comm, const int* excludeRanks, int excludeCount,
                                        ridgeComm_t* newcomm, ridgeConfig_t* config, int shrinkFlags);

/**
 * Completes all outstanding operations and tears down connections in step with the
 * peers. Collective. After it, only ridgeCommDestroy may be called.
 */
RIDGE_API ridgeResult_t ridgeCommFinalize(ridgeComm_t comm);

/** Frees the communicator. Calls ridgeCommFinalize first if the caller did not. */
RIDGE_API ridgeResult_t ridgeCommDestroy(ridgeComm_t comm);

/**
 * Marks the communicator aborted and frees it. Safe to call from another thread
 * while a collective is blocked: the blocked call returns ridgeAborted, and streams
 * waiting on the communicator's device collectives are released. Not collective.
 */
RIDGE_API ridgeResult_t ridgeCommAbort(ridgeComm_t comm);

/**
 * Reports the communicator's state: ridgeSuccess, ridgeInProgress while a
 * non-blocking init runs, or the error that broke it (a dead peer, a timeout, ...).
 */
RIDGE_API ridgeResult_t ridgeCommGetAsyncError(ridgeComm_t comm, ridgeResult_t* asyncError);

/** Writes the number of ranks in the communicator. */
RIDGE_API ridgeResult_t ridgeCommCount(const ridgeComm_t comm, int* count);

/** Writes this rank's index in the communicator. */
RIDGE_API ridgeResult_t ridgeCommUserRank(const ridgeComm_t comm, int* rank);

/**
 * Writes the CUDA device of the communicator: the device current on the thread that
 * created it, in CUDA builds on a machine with a device; -1 otherwise.
 */
RIDGE_API ridgeResult_t ridgeCommCuDevice(const ridgeComm_t comm, int* device);

/**
 * Writes the state of `comm` (NULL: of every communicator of this process) to file
 * descriptor `fd` (2 for stderr), as RIDGE_DEBUG_DUMP does on its signal: operations started
 * and finished, the one running (kind, arguments, sequence number) and, per peer, the latest
 * collective seen from it, so that the rank a hung job waits for can be found. Safe to call
 * from another thread while a collective is blocked; not collective.
 */
RIDGE_API ridgeResult_t ridgeCommDumpState(const ridgeComm_t comm, int fd);

/** A fixed English string for a result code; never NULL. */
RIDGE_API const char* ridgeGetErrorString(ridgeResult_t result);

/**
 * Text of the last error raised on this thread for `comm` (or by any call when comm is
 * NULL): which call, which argument, which peer. Empty string when there was none.
 */
RIDGE_API const char* ridgeGetLastError(ridgeComm_t comm);

/**
 * Reduces `count` elements of every rank's sendbuff with `op` and writes the result
 * to every rank's recvbuff. In place when sendbuff == recvbuff.
 */
RIDGE_API ridgeResult_t ridgeAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ridgeDataType_t datatype, ridgeRedOp_t op, ridgeComm_t comm,
                                       ridgeStream_t stream);

/**
 * Copies `count` elements of root's sendbuff to every rank's recvbuff. sendbuff is read
 * on root only. In place when sendbuff == recvbuff on root.
 */
RIDGE_API ridgeResult_t ridgeBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                       ridgeDataType_t datatype, int root, ridgeComm_t comm,
                                       ridgeStream_t stream);

/** In-place broadcast: ridgeBroadcast(buff, buff, ...) (NCCL's legacy ncclBcast). */
RIDGE_API ridgeResult_t ridgeBcast(void* buff, size_t count, ridgeDataType_t datatype, int root,
                                   ridgeComm_t comm, ridgeStream_t stream);

/** Reduces every rank's sendbuff into root's recvbuff (recvbuff is ignored elsewhere). */
RIDGE_API ridgeResult_t ridgeReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ridgeDataType_t datatype, ridgeRedOp_t op, int root, ridgeComm_t comm,
                                    ridgeStream_t stream);

/**
 * Gathers `sendcount` elements from every rank into every rank's recvbuff, rank i's
 * block at offset i*sendcount. In place when sendbuff == recvbuff + rank*sendcount.
 */
RIDGE_API ridgeResult_t ridgeAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ridgeDataType_t datatype, ridgeComm_t comm, ridgeStream_t stream);

/**
 * Reduces nranks*recvcount elements across ranks and leaves block i of the result in
 * rank i's recvbuff. In place when recvbuff == sendbuff + rank*recvcount.
 */
RIDGE_API ridgeResult_t ridgeReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ridgeDataType_t datatype, ridgeRedOp_t op, ridgeComm_t comm,
                                           ridgeStream_t stream);

/**
 * Sends block j (of `count` elements) of sendbuff to rank j, which stores it as block i
 * of its recvbuff (i = this rank). In place when sendbuff == recvbuff.
 */
RIDGE_API ridgeResult_t ridgeAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                      ridgeDataType_t datatype, ridgeComm_t comm, ridgeStream_t stream);

/**
 * Gathers `count` elements of every rank's sendbuff into root's recvbuff, rank i's block at
 * offset i*count (recvbuff is used on root only). In place on root when
 * sendbuff == recvbuff + root*count. Runs as one group of sends and receives.
 */
RIDGE_API ridgeResult_t ridgeGather(const void* sendbuff, void* recvbuff, size_t count,
                                    ridgeDataType_t datatype, int root, ridgeComm_t comm,
                                    ridgeStream_t stream);

/**
 * Scatters root's sendbuff: block i (of `count` elements) goes to rank i's recvbuff
 * (sendbuff is read on root only). In place on root when recvbuff == sendbuff + root*count.
 */
RIDGE_API ridgeResult_t ridgeScatter(const void* sendbuff, void* recvbuff, size_t count,
                                     ridgeDataType_t datatype, int root, ridgeComm_t comm,
                                     ridgeStream_t stream);

/**
 * Creates a reduction operator for `comm` that multiplies each rank's input by a scalar of
 * `datatype` before summing (sum over ranks of scalar*x; half and bfloat16 multiply in
 * float32). The operator is valid with AllReduce, Reduce and ReduceScatter on `comm` and
 * `datatype` only, on host memory (device memory: ridgeInvalidUsage, not yet supported).
 * With ridgeScalarHostImmediate the scalar is copied now; with ridgeScalarDevice the
 * pointer must stay valid and is read each time a collective using the operator runs.
 */
RIDGE_API ridgeResult_t ridgeRedOpCreatePreMulSum(ridgeRedOp_t* op, void* scalar, ridgeDataType_t datatype,
                                                  ridgeScalarResidence_t residence, ridgeComm_t comm);

/** Frees an operator of ridgeRedOpCreatePreMulSum (its handle may be reused later). */
RIDGE_API ridgeResult_t ridgeRedOpDestroy(ridgeRedOp_t op, ridgeComm_t comm);

/**
 * Allocates memory for communication buffers: device memory of the current CUDA device in a
 * CUDA build with a device, page-aligned host memory otherwise. Free it with ridgeMemFree.
 * Host memory is shareable with the ranks of the same host: a peer maps it once and reads,
 * reduces from and writes it with plain loads and stores instead of a cross-memory-attach
 * system call per access (faster single-copy collectives and send/recv). No registration
 * (ridgeCommRegister) is needed for that. Each such buffer keeps a file descriptor open: past
 * a quarter of the soft RLIMIT_NOFILE (or 500 buffers) host memory is private again. Unlike
 * private memory, it stays shared with a process forked after the allocation.
 */
RIDGE_API ridgeResult_t ridgeMemAlloc(void** ptr, size_t size);

/** Frees memory of ridgeMemAlloc; any other pointer is ridgeInvalidArgument. */
RIDGE_API ridgeResult_t ridgeMemFree(void* ptr);

/**
 * Registers [buff, buff+size) with `comm` and returns a handle for ridgeCommDeregister.
 * Host memory is locked in RAM when RLIMIT_MEMLOCK allows it, so that the single-copy path
 * (peers reading it through CMA) never waits on a page brought back from swap, and the
 * single-copy path counts the collectives whose buffers were registered (debug counters).
 * Overlapping registrations are allowed; each has its own handle.
 */
RIDGE_API ridgeResult_t ridgeCommRegister(const ridgeComm_t comm, void* buff, size_t size, void** handle);

/** Drops a registration of ridgeCommRegister; a handle of another communicator or one
 *  already dropped is ridgeInvalidArgument. */
RIDGE_API ridgeResult_t ridgeCommDeregister(const ridgeComm_t comm, void* handle);

/**
 * Sends `count` elements to rank `peer`, which must post a matching ridgeRecv (same count
 * times datatype size, in the same order). As in NCCL, the call completes when the data has
 * been handed to the transport, not when the peer has it: a short message may be queued
 * before the peer posts its receive, a long one waits for the peer to drain it (so a send
 * without its receive may return, or fail with ridgeTimeout after RIDGE_TIMEOUT). The
 * buffer may be reused once the call (or the group) returns. A send nobody receives never
 * lands in a later call: every operation carries a signature (kind, count, datatype, op,
 * root or peer, sequence number), and the next collective between the two ranks fails on
 * both with ridgeInvalidUsage naming the unmatched send; the communicator is then broken.
 * Put a rank's sends and receives in one group to exchange data without ordering them.
 *
 * `peer` may be the calling rank, inside a group only: the group's k-th send to self is
 * matched with its k-th receive from self (issue order), which must have the same count and
 * datatype, and the pair is a local copy (device memory: a copy stream-ordered with the rest
 * of the group, on the receive's stream after the send's stream's earlier work). A send to
 * self without its receive (or the reverse), a count or datatype mismatch, or a send or
 * receive to self outside a group fails with ridgeInvalidUsage (at ridgeGroupEnd in a group,
 * before any of the group runs) instead of waiting forever.
 */
RIDGE_API ridgeResult_t ridgeSend(const void* sendbuff, size_t count, ridgeDataType_t datatype, int peer,
                                  ridgeComm_t comm, ridgeStream_t stream);

/** Receives `count` elements from rank `peer` into recvbuff; from the calling rank itself
 *  only in a group, matched with a send to self (see ridgeSend). */
RIDGE_API ridgeResult_t ridgeRecv(void* recvbuff, size_t count, ridgeDataType_t datatype, int peer,
                                  ridgeComm_t comm, ridgeStream_t stream);

/**
 * Starts a group: calls until the matching ridgeGroupEnd are queued, not run. Groups
 * nest; only the outermost ridgeGroupEnd runs them. Per thread.
 */
RIDGE_API ridgeResult_t ridgeGroupStart(void);

/**
 * Runs every operation queued since the outermost ridgeGroupStart, progressing them
 * together so that, for example, a send and a receive between the same two ranks do
 * not deadlock. Returns the first error any of them raised.
 */
RIDGE_API ridgeResult_t ridgeGroupEnd(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RIDGE_RIDGE_H */
