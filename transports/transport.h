// The transport interface: the only thing collective algorithms see of how bytes move.
//
// A transport connects this rank to a set of peers and hands out, per peer, a send
// connector and a receive connector. Each connector is a FIFO of fixed-size slots:
// the sender acquires a free slot, writes the payload straight into it (so a reduction
// can be fused with the copy), and posts it; the receiver peeks at the oldest posted
// slot, consumes it (again possibly fused with a reduction into the user buffer), and
// releases it back to the sender. Every operation is non-blocking: algorithms run as
// coroutines that suspend while a connector has no slot, and the executor decides when
// to spin, yield or sleep (Transport::waitForActivity).
//
// Slot metadata carries the payload size and a "last chunk of a message" flag so that
// a receiver expecting a different message size fails with a clear error instead of
// silently misreading the stream.
//
// Optional extension (kDirectTransferVersion): a connector may also move chunks straight
// from and into caller memory, which saves the copy into the send slot and the copy out
// of the receive slot. See the comments on the send and receive halves below.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace ridge {

class Bootstrap;

// Version of the direct-transfer extension of the connectors. A connector whose
// directVersion() is at least this implements tryPostDirect/sendsComplete (send) and
// tryExpect/declaredAhead (receive) and withdrawDirect (both); 0 means slots only, and
// the other calls are then never made. Chunks moved either way are the same chunks on the
// wire: each rank decides per connector, and a peer cannot tell the difference.
constexpr uint32_t kDirectTransferVersion = 1;

// Metadata of one posted slot.
struct SlotInfo {
  uint32_t bytes = 0;
  bool lastOfMessage = false;
  uint64_t tag = 0;  // the tag of a tagged post (the tag extension below), else 0
};

// ---- device-side producer extension (the gdr transport in write mode, docs/gdr-write.md) ----
// A connector whose messages the device can send itself: device code writes the payload from
// device memory straight into the transport's staging, builds the work requests and rings the
// doorbell, instead of a host copy into a slot and a host post.
class DeviceProducer {
 public:
  using Fn = void (*)(void* arg, const void* src, size_t bytes);
  virtual ~DeviceProducer() = default;
  // What the device runs for the next message (fn(*arg, src, bytes), src as the device sees
  // it), cut into chunks of slotBytes() as the receiver expects. Changes nothing by itself.
  virtual Fn deviceFunction(void** arg) = 0;
  // Once the device has run it: the message's status.
  virtual Status finishDeviceSend() = 0;
  // Collectives on device buffers (the GPU proxy, while a batch of them runs on this
  // connector): the payload reaches the acquired slot by the device data ops (a copy or a
  // reduction on their stream), and post() queues the slot's post (seal, work request,
  // doorbell) as device code behind it through `launch(queue, fn, arg, src, bytes)` instead of
  // posting from the host; tryAcquire() waits until the device has run the last one. A
  // launch that is refused falls back to the host post. Unbound with launch == nullptr.
  using Launch = Status (*)(void* queue, Fn fn, void* arg, const void* src, size_t bytes);
  virtual void bindDeviceQueue(Launch launch, void* queue) = 0;
};

class SendConnector {
 public:
  SendConnector(size_t slotBytes, int peer) : slotBytes_(slotBytes), peer_(peer) {}
  virtual ~SendConnector() = default;
  // The next free slot, or nullptr while the FIFO is full. Repeated calls before
  // post() return the same slot.
  virtual void* tryAcquire() = 0;
  // Publishes the acquired slot with `bytes` (<= slotBytes()) of payload.
  virtual void post(uint32_t bytes, bool lastOfMessage) = 0;
  // How many chunks this rank can post to the peer before the peer has released any,
  // counting the transport's own queues at both ends but never kernel or NIC buffers, the
  // same at both ends of a connection. An algorithm that posts ahead of its receives keeps
  // within this and so cannot deadlock where nothing else buffers. 0: not stated (post
  // nothing ahead).
  virtual uint32_t chunksInFlight() const { return 0; }
  // How many of the chunks posted so far the peer has not released yet, or -1 where the
  // transport cannot tell (the default). A sender that must not return before the peer has
  // consumed what it posted (a single-copy send names its buffer in a slot: coll/p2p_copy.h)
  // waits for 0 instead of an acknowledgement message. Never blocks.
  virtual int64_t unreleasedChunks() { return -1; }

  // ---- direct-transfer extension (only when directVersion() >= kDirectTransferVersion) ----
  virtual uint32_t directVersion() const { return 0; }
  // Queues `bytes` (<= slotBytes()) of caller memory at `src` as the next chunk, in FIFO
  // order with slot posts, without copying it: the transport reads it later, so it must
  // stay unchanged until sendsComplete(). Takes a FIFO position like a slot; false while
  // the FIFO is full (nothing queued; call again). Not between tryAcquire() and post().
  virtual bool tryPostDirect(const void* /*src*/, uint32_t /*bytes*/, bool /*lastOfMessage*/) {
    return false;
  }
  // Whether every chunk posted so far (slot or direct) has left this process's memory, so
  // the caller may reuse what it queued. Never blocks.
  virtual bool sendsComplete() { return true; }
  // The shortest message a point-to-point send queues from caller memory rather than
  // copying it into slots (coll/algorithms.cpp, sendMessage): a full slot unless the
  // transport knows that handing a copied slot to its progress thread costs more.
  virtual size_t directSendMinBytes() const { return slotBytes(); }
  // Called by an operation that ends without completing (error, abort, timeout) while it
  // may have direct chunks queued: afterwards the transport never reads them. When some
  // were still queued the connection to the peer is failed (what it already received
  // would be a partial message). Waits at most for one pass of a progress thread.
  virtual void withdrawDirect() {}

  // The device-side producer of this connector, or nullptr (the default: host copies).
  virtual DeviceProducer* deviceProducer() { return nullptr; }

  // ---- tag extension (only when carriesTags()) ----
  // A transport whose slot metadata has room carries a 64-bit tag beside it, in the cache
  // line the receiver reads anyway (SlotInfo::tag; an untagged post gives 0), and whose slots
  // are memory both ranks see whole: the receiver may read any byte of a posted slot, not only
  // its first `bytes`. The operation signatures (coll/signature.h) put a call's digest in the
  // tag and its full description in the slot's last line, read only when the digests differ.
  virtual bool carriesTags() const { return false; }
  // post() with a tag (untagged where carriesTags() is false).
  virtual void postTagged(uint32_t bytes, bool lastOfMessage, uint64_t /*tag*/) {
    post(bytes, lastOfMessage);
  }

  size_t slotBytes() const { return slotBytes_; }
  // The rank at the other end.
  int peer() const { return peer_; }

 private:
  const size_t slotBytes_;
  const int peer_;
};

class RecvConnector {
 public:
  RecvConnector(size_t slotBytes, int peer) : slotBytes_(slotBytes), peer_(peer) {}
  virtual ~RecvConnector() = default;
  // The oldest posted slot (and its metadata), or nullptr while none is posted.
  virtual const void* tryPeek(SlotInfo* info) = 0;
  // Returns the peeked slot to the sender.
  virtual void release() = 0;

  // ---- direct-transfer extension (only when directVersion() >= kDirectTransferVersion) ----
  virtual uint32_t directVersion() const { return 0; }
  // Declares where the next undeclared chunk (in FIFO order) should land: at `dst`, which
  // has room for `capacity` bytes, or in a slot when `dst` is null. False while as many
  // chunks are declared and not released as the FIFO has positions (call again later).
  // tryPeek() then returns `dst` once the chunk is there, or a slot when it could not
  // land at `dst` (larger than `capacity`: the caller sees the size and reports the
  // mismatch; or declared before this call, see declaredAhead()). release() as usual.
  // Until that chunk is peeked, the transport may write to [dst, dst + capacity).
  virtual bool tryExpect(void* /*dst*/, uint32_t /*capacity*/) { return false; }
  // How many chunks not yet released are declared already (by earlier tryExpect calls,
  // or as slots by a tryPeek without one: slot-only users get read-ahead that way). A
  // caller that plans its chunks from here skips that many: they arrive in slots.
  virtual uint32_t declaredAhead() const { return 0; }
  // A caller that declares its chunks (tryExpect) starts: a transport that reads ahead into
  // slots for slot-only users stops declaring more slots as they are released, so that what
  // it declared drains and this caller's chunks land where it declares them. Without it, a
  // read-ahead that re-declares every released slot never ends for messages of fewer chunks
  // than the FIFO has positions (issue 21: a TCP broadcast after any slot-only collective
  // landed in slots and was copied out).
  virtual void endReadAhead() {}
  // As SendConnector::withdrawDirect: afterwards the transport never writes to a
  // declared destination; when some were still outstanding the peer's connection fails.
  virtual void withdrawDirect() {}

  // As SendConnector::carriesTags (the same at both ends of a connection).
  virtual bool carriesTags() const { return false; }

  size_t slotBytes() const { return slotBytes_; }
  // The rank at the other end.
  int peer() const { return peer_; }

 private:
  const size_t slotBytes_;
  const int peer_;
};

// Optional single-copy access to a peer's memory (shm: cross-memory attach; a network
// transport would map this to RDMA READ/WRITE). Addresses are the peer's virtual
// addresses, exchanged by the algorithm through the connectors. Blocking, but bounded by
// the size of the copy: no waiting on the peer is involved.
//
// Mapped access (shm, issue 21): where [remoteAddr, remoteAddr + bytes) lies in memory the
// peer shares (its ridgeMemAlloc host buffers, core/shared_segments.h), mapped() returns
// where that range is in this process, to read (or reduce from, or write) with plain loads
// and stores: no system call and no page pinning per access. read() and write() then copy
// through the mapping themselves. The pointer is valid until the next call on this object;
// the peer's buffer must not change hands meanwhile, as for read() and write().
struct PeerMemoryCounters {
  uint64_t mappedAccesses = 0;  // reads, writes and mapped() calls served by a mapping
  uint64_t copiedAccesses = 0;  // reads and writes that took the system call (CMA)
  uint64_t segmentsMapped = 0;  // peer segments mapped (each once while it lives)
  uint64_t staleMappings = 0;   // cached mappings dropped because the peer freed the segment
};
class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  virtual Status read(void* local, uint64_t remoteAddr, size_t bytes) = 0;
  virtual Status write(uint64_t remoteAddr, const void* local, size_t bytes) = 0;
  // The local address of the peer's [remoteAddr, remoteAddr + bytes), or nullptr where the
  // range is not mapped here (then read()/write() take the other way).
  virtual const void* mapped(uint64_t /*remoteAddr*/, size_t /*bytes*/) { return nullptr; }
  virtual void* mappedForWrite(uint64_t /*remoteAddr*/, size_t /*bytes*/) { return nullptr; }
  // What took which path (tests, debugging).
  virtual PeerMemoryCounters counters() const { return {}; }
};

class NetRingAllocator;  // transports/net/net_transport.h

// What a transport needs to know to connect one communicator.
struct TransportSetup {
  int rank = 0;
  int nranks = 0;
  std::vector<uint64_t> hostHashOfRank;  // ranks with equal hashes share a host
  std::vector<int> pidOfRank;
  Bootstrap* bootstrap = nullptr;  // out-of-band exchange during connect
  const std::atomic<bool>* abortFlag = nullptr;
  int timeoutSeconds = 0;
  // The net transport only: where this instance's receive rings and send areas live (device
  // memory for the GPUDirect RDMA data path); null: the process-wide setNetRingAllocator.
  NetRingAllocator* netRingAllocator = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Connectors to/from `peer`; nullptr if this transport does not reach it.
  virtual SendConnector* sendTo(int peer) = 0;
  virtual RecvConnector* recvFrom(int peer) = 0;
  // Single-copy access to `peer`'s memory, or nullptr. Either every rank of the
  // communicator gets it for all its peers or none does (decided collectively at init),
  // because algorithms that use it must be chosen identically everywhere.
  virtual PeerMemory* peerMemory(int /*peer*/) { return nullptr; }
  // Called by a rank that has nothing to do: returns when a peer may have posted or
  // released a slot, or after at most `maxWaitNs`. May return early spuriously.
  // `stillIdle` is re-checked after announcing the sleep, to close the race with a
  // peer that posts just before we go to sleep.
  virtual void waitForActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) = 0;
  // Slow-path health check, called while waiting on `peer`: a non-OK status if it is
  // known to be gone (process exited, connection closed). Only peers that a waiting
  // operation depends on are checked: a peer that finished and left is no error.
  virtual Status checkPeer(int peer) = 0;
  // Threads of its own that this transport keeps busy while a collective moves bytes (the
  // socket transport's progress threads): the executor counts them with the ranks of the
  // host when it decides whether a waiting rank may spin, since a spinning rank takes the
  // core that one of them needs.
  virtual int progressThreads() const { return 0; }
  // Called by the algorithm thread when it is about to wait (the executor's first idle poll):
  // a transport whose progress threads write what the algorithm posted may write what is
  // still queued from this thread now, since it has nothing else to do, instead of leaving
  // it until a progress thread is scheduled (issue 21: on 2 cores that hand-off sat on the
  // path of every TCP broadcast's data and header). Never blocks.
  virtual void flushSends() {}
};

// A transport type, registered once. Tables start with their size and version so that
// out-of-tree transports built against an older header can be recognised and refused.
// 2: the connector and transport classes gained virtual functions
// (SendConnector::chunksInFlight, Transport::progressThreads), so an older build's vtables
// no longer match. 3: SendConnector::unreleasedChunks. 4: PeerMemory::mapped, mappedForWrite
// and counters; RecvConnector::endReadAhead, Transport::flushSends.
constexpr uint32_t kTransportTableVersion = 4;
struct TransportTable {
  uint32_t size;     // sizeof(TransportTable) the transport was built with
  uint32_t version;  // kTransportTableVersion the transport was built with
  const char* name;
  // Whether this transport can connect ranks a and b of the setup.
  bool (*canConnect)(const TransportSetup& setup, int a, int b);
  // Connects this rank to every peer it can reach. Collective over the ranks it reaches.
  Status (*create)(const TransportSetup& setup, std::unique_ptr<Transport>* out);
};

// Adds a table; refuses (returns false, logs WARN) a wrong size or version.
bool registerTransport(const TransportTable* table);
// Registered tables in priority order (the first that can connect a pair wins).
const std::vector<const TransportTable*>& registeredTransports();
// Whether a table registered before `table` can connect ranks a and b, so that the pair is
// not `table`'s to carry.
bool connectedBefore(const TransportTable* table, const TransportSetup& setup, int a, int b);
// RIDGE_SHM_SLOT_BYTES as the shm transport applies it: 4K to 1G (else 256K, with a WARN
// when `warn`), rounded up to 4 KiB.
int64_t shmSlotBytes(bool warn);
// The algorithms cut a message into chunks of one size on every rank, taken from whichever
// connector the rank uses first, so when shared memory carries some pairs of the
// communicator (a transport registered before `self` connected them) a later transport's
// slot payload must be shm's: shmSlotBytes() then, else `own`.
int64_t slotBytesBesideShm(const TransportTable* self, const TransportSetup& setup, int64_t own);

}  // namespace ridge
