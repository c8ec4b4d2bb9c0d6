// Memory: the NIC's region table (keys, translation of WQE addresses) and its staging chunks
// (packet staging and device memory), and the verbs objects over them: memory regions,
// device memory and the protection domain.
#include "transports/softnic/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "transports/softnic/nic.h"
#include "transports/softnic/queues.h"

namespace ridge {
namespace softnic {

using namespace verbs;

Status Nic::registerRegion(char* base, uint64_t start, uint64_t length, uint32_t access, uint32_t* key) {
  std::lock_guard<std::mutex> g(regionMutex_);
  for (uint32_t i = 1; i < kMaxRegions; ++i) {
    RegionEntry& e = regions_[i];
    if (e.key.load(std::memory_order_relaxed) != 0) continue;
    e.base = base;
    e.start = start;
    e.length = length;
    e.access = access;
    keyGeneration_ = (keyGeneration_ + 1) & 0xff;
    if (keyGeneration_ == 0) keyGeneration_ = 1;
    *key = (i << 8) | keyGeneration_;
    e.key.store(*key, std::memory_order_release);
    return Status::ok();
  }
  return makeError(ridgeSystemError, "softnic: %u memory regions registered already", kMaxRegions - 1);
}

void Nic::deregisterRegion(uint32_t key) {
  std::lock_guard<std::mutex> g(regionMutex_);
  uint32_t i = key >> 8;
  if (i > 0 && i < kMaxRegions && regions_[i].key.load() == key)
    regions_[i].key.store(0, std::memory_order_release);
}

char* Nic::translate(uint32_t key, uint64_t addr, uint64_t len, uint32_t needAccess) {
  uint32_t i = key >> 8;
  if (i == 0 || i >= kMaxRegions) return nullptr;
  RegionEntry& e = regions_[i];
  if (e.key.load(std::memory_order_acquire) != key) return nullptr;
  if ((e.access & needAccess) != needAccess) return nullptr;
  if (addr < e.start || len > e.length || addr - e.start > e.length - len) return nullptr;
  return e.base + (addr - e.start);
}

Status Nic::reserveStaging(size_t bytes, char** out, std::vector<int32_t>* chunks) {
  bool found = false;
  runOnEngine([&] {
    const size_t n = (bytes + chunkBytes_ - 1) / chunkBytes_;
    const size_t total = chunkIsDm_.size();
    std::vector<uint8_t> isFree(total, 0);
    for (int32_t c : freeChunks_) isFree[c] = 1;
    // From the top down, so device memory and packet staging meet in the middle.
    for (size_t first = total >= n ? total - n + 1 : 0; first-- > 0;) {
      bool ok = true;
      for (size_t k = 0; k < n && ok; ++k) ok = isFree[first + k];
      if (!ok) continue;
      for (size_t k = 0; k < n; ++k) {
        chunkIsDm_[first + k] = 1;
        chunks->push_back(static_cast<int32_t>(first + k));
      }
      freeChunks_.erase(std::remove_if(freeChunks_.begin(), freeChunks_.end(),
                                       [&](int32_t c) { return chunkIsDm_[c] != 0; }),
                        freeChunks_.end());
      *out = staging_ + first * chunkBytes_;
      found = true;
      return;
    }
  });
  if (!found)
    return makeError(ridgeSystemError, "softnic: no %zu contiguous free bytes of staging memory left", bytes);
  return Status::ok();
}

void Nic::releaseStaging(const std::vector<int32_t>& chunks) {
  runOnEngine([&] {
    for (int32_t c : chunks) {
      chunkIsDm_[c] = 0;
      freeChunks_.push_back(c);
    }
  });
}

int32_t Nic::allocChunk() {
  if (freeChunks_.empty()) return -1;
  if (opt_.faults.stagingExhaust > 0 && random01() < opt_.faults.stagingExhaust) {
    ctr_.injectedStagingExhaust.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }
  int32_t c = freeChunks_.back();
  freeChunks_.pop_back();
  return c;
}

namespace {

class SoftMr final : public MemoryRegion {
 public:
  SoftMr(std::shared_ptr<Nic> nic, uint64_t addr, size_t len, uint32_t key) : nic_(std::move(nic)) {
    addr_ = addr;
    length_ = len;
    lkey_ = rkey_ = key;
  }
  ~SoftMr() override {
    nic_->deregisterRegion(lkey_);
    if (mapping_) munmap(mapping_, mappingBytes_);  // after: the NIC no longer translates into it
  }
  // A mapping the region owns (a registered dma-buf), unmapped when the region goes.
  void ownMapping(void* p, size_t bytes) {
    mapping_ = p;
    mappingBytes_ = bytes;
  }

 private:
  std::shared_ptr<Nic> nic_;
  void* mapping_ = nullptr;
  size_t mappingBytes_ = 0;
};

class SoftDm final : public DeviceMemory {
 public:
  SoftDm(std::shared_ptr<Nic> nic, char* base, size_t bytes, std::vector<int32_t> chunks)
      : nic_(std::move(nic)), base_(base), bytes_(bytes), chunks_(std::move(chunks)) {}
  ~SoftDm() override {
    mr_.reset();
    nic_->releaseStaging(chunks_);
  }
  size_t size() const override { return bytes_; }
  Status copyTo(size_t offset, const void* src, size_t bytes) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      return makeError(ridgeInvalidArgument, "softnic: copy of %zu bytes at %zu outside device memory of %zu",
                       bytes, offset, bytes_);
    std::memcpy(base_ + offset, src, bytes);
    return Status::ok();
  }
  Status copyFrom(void* dst, size_t offset, size_t bytes) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      return makeError(ridgeInvalidArgument, "softnic: copy of %zu bytes at %zu outside device memory of %zu",
                       bytes, offset, bytes_);
    std::memcpy(dst, base_ + offset, bytes);
    return Status::ok();
  }
  MemoryRegion* region() override { return mr_.get(); }
  void* mapped() override { return base_; }

  std::shared_ptr<Nic> nic_;
  char* base_;
  size_t bytes_;
  std::vector<int32_t> chunks_;
  std::unique_ptr<SoftMr> mr_;
};

class SoftPd final : public ProtectionDomain {
 public:
  explicit SoftPd(std::shared_ptr<Nic> nic) : nic_(std::move(nic)) {}
  Status registerMemory(void* addr, size_t bytes, uint32_t access,
                        std::unique_ptr<MemoryRegion>* out) override {
    if (!addr || bytes == 0)
      return makeError(ridgeInvalidArgument, "softnic: registration of an empty range");
    uint32_t key = 0;
    RIDGE_TRY(nic_->registerRegion(static_cast<char*>(addr), reinterpret_cast<uint64_t>(addr), bytes, access,
                                   &key));
    *out = std::make_unique<SoftMr>(nic_, reinterpret_cast<uint64_t>(addr), bytes, key);
    return Status::ok();
  }
  // A dma-buf is memory this process can reach only through the fd: softnic maps it
  // (mmap) and serves the region from the mapping, with `iova` as the address WQEs use.
  // Buffers that support mmap work (memfd in tests, udmabuf); a GPU driver's dma-buf
  // usually refuses a CPU mapping, and then the registration fails with the mmap error
  // (the caller falls back to peer memory, which softnic cannot reach either: softnic
  // only emulates GPU memory registration, it does not reach GPU memory).
  Status registerDmaBuf(int fd, uint64_t offset, size_t bytes, uint64_t iova, uint32_t access,
                        std::unique_ptr<MemoryRegion>* out) override {
    if (fd < 0 || bytes == 0)
      return makeError(ridgeInvalidArgument, "softnic: dma-buf registration of fd %d, %zu bytes", fd, bytes);
    // Mapping past the end of the buffer would succeed and then fault (SIGBUS) when the
    // NIC touches it: check the size first (dma-buf and memfd fds report it through lseek;
    // the fd's position is put back).
    const off_t was = lseek(fd, 0, SEEK_CUR);
    const off_t size = was < 0 ? -1 : lseek(fd, 0, SEEK_END);
    if (was >= 0) lseek(fd, was, SEEK_SET);
    if (size >= 0 && (offset > static_cast<uint64_t>(size) || bytes > static_cast<uint64_t>(size) - offset))
      return makeError(ridgeInvalidArgument,
                       "softnic: dma-buf fd %d holds %lld bytes; %zu at offset %llu do not fit", fd,
                       static_cast<long long>(size), bytes, static_cast<unsigned long long>(offset));
    static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t mapOffset = offset & ~(page - 1);
    const size_t mapBytes = static_cast<size_t>(offset - mapOffset) + bytes;
    void* map =
        mmap(nullptr, mapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(mapOffset));
    if (map == MAP_FAILED)
      return makeError(ridgeSystemError, "softnic: cannot map dma-buf fd %d (%zu bytes at offset %llu): %s",
                       fd, bytes, static_cast<unsigned long long>(offset), std::strerror(errno));
    uint32_t key = 0;
    Status st =
        nic_->registerRegion(static_cast<char*>(map) + (offset - mapOffset), iova, bytes, access, &key);
    if (!st.isOk()) {
      munmap(map, mapBytes);
      return st;
    }
    auto mr = std::make_unique<SoftMr>(nic_, iova, bytes, key);
    mr->ownMapping(map, mapBytes);
    *out = std::move(mr);
    return Status::ok();
  }
  Status allocDeviceMemory(size_t bytes, uint32_t access, std::unique_ptr<DeviceMemory>* out) override {
    if (bytes == 0 || bytes > nic_->attributes().maxDeviceMemoryBytes)
      return makeError(ridgeInvalidArgument, "softnic: device memory of %zu bytes (at most %llu)", bytes,
                       static_cast<unsigned long long>(nic_->attributes().maxDeviceMemoryBytes));
    char* base = nullptr;
    std::vector<int32_t> chunks;
    RIDGE_TRY(nic_->reserveStaging(bytes, &base, &chunks));
    auto dm = std::make_unique<SoftDm>(nic_, base, bytes, std::move(chunks));
    uint32_t key = 0;
    // Zero-based, as on hardware: WQEs address device memory by offset.
    RIDGE_TRY(nic_->registerRegion(base, 0, bytes, access, &key));
    dm->mr_ = std::make_unique<SoftMr>(nic_, 0, bytes, key);
    *out = std::move(dm);
    return Status::ok();
  }
  Status createCq(uint32_t entries, std::unique_ptr<CompletionQueue>* out) override {
    *out = std::make_unique<SoftCq>(nic_, entries);
    return Status::ok();
  }
  Status createQp(CompletionQueue* sendCq, CompletionQueue* recvCq, const QpCaps& caps,
                  std::unique_ptr<QueuePair>* out) override {
    auto* s = dynamic_cast<SoftCq*>(sendCq);
    auto* r = dynamic_cast<SoftCq*>(recvCq);
    if (!s || !r) return makeError(ridgeInvalidArgument, "softnic: createQp needs CQs of the same softnic");
    *out = std::make_unique<SoftQp>(nic_, s, r, caps);
    return Status::ok();
  }

 private:
  std::shared_ptr<Nic> nic_;
};

}  // namespace

std::unique_ptr<ProtectionDomain> newProtectionDomain(std::shared_ptr<Nic> nic) {
  return std::make_unique<SoftPd>(std::move(nic));
}

}  // namespace softnic
}  // namespace ridge
