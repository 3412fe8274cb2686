// kvmap's caching allocator for torch's CPU tensors (kvmap/host_allocator.hpp): a
// c10::Allocator in torch's CPU slot whose large blocks go to a BlockCache when freed.
#include "kvmap/host_allocator.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <new>
#include <string>

#include "kvmap/error.hpp"
#include "block_cache.hpp"
#include "torch_compat.hpp"
#include "host_allocator_start.hpp"

namespace kvmap {
namespace Detail {

namespace {

// Each allocation starts with a header of c10's alignment (64 bytes), so that the data after
// it keeps that alignment and a deleter given only the data pointer (raw_deallocate, and the
// DataPtr's context, which is the data pointer as torch's own allocator makes it) finds the
// block's size and capacity.
constexpr std::size_t kHostHeaderBytes = 64;
constexpr std::uint64_t kMagic = 0x6b766d61702d6861ull;  // "kvmap-ha"

struct HostBlockHeader {
  std::uint64_t magic;
  std::size_t bytes;     // the size torch asked for
  std::size_t capacity;  // the block's bytes, header included; 0 for a small block
};
static_assert(sizeof(HostBlockHeader) <= kHostHeaderBytes);

// A block of c10::alloc_cpu memory, freed with c10::free_cpu (a BlockCache's Block).
class HostRawBlock {
 public:
  explicit HostRawBlock(void* base) : base_(base) {}
  HostRawBlock(HostRawBlock&& other) noexcept : base_(other.release()) {}
  HostRawBlock& operator=(HostRawBlock&& other) noexcept {
    if (this != &other) {
      reset();
      base_ = other.release();
    }
    return *this;
  }
  HostRawBlock(const HostRawBlock&) = delete;
  HostRawBlock& operator=(const HostRawBlock&) = delete;
  ~HostRawBlock() { reset(); }
  void* release() {
    void* b = base_;
    base_ = nullptr;
    return b;
  }

 private:
  void reset() {
    if (base_) c10::free_cpu(base_);
    base_ = nullptr;
  }
  void* base_ = nullptr;
};

class HostAllocator final : public c10::Allocator {
 public:
  // Never destroyed: tensors may be freed during the process' exit, after static destructors.
  static HostAllocator& instance() {
    static auto* allocator = new HostAllocator();
    return *allocator;
  }

  c10::DataPtr allocate(std::size_t n) KVMAP_C10_ALLOCATE_CONST override {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    TORCH_CHECK(n <= std::numeric_limits<std::size_t>::max() - kHostHeaderBytes - kHugePage,
                "kvmap host allocator: ", n, " bytes is more than size_t counts");
    const std::size_t total = n + kHostHeaderBytes;
    void* base = nullptr;
    std::size_t capacity = 0;
    if (total >= kCachedMinimum) {
      capacity = cached_capacity(total);
      if (auto kept = cache_.take(capacity)) {
        base = kept->first.release();
        capacity = kept->second;
      } else {
        base = c10::alloc_cpu(capacity);
        advise_huge_pages(base, capacity);
      }
    } else {
      base = c10::alloc_cpu(total);
      small_.fetch_add(1, std::memory_order_relaxed);
    }
    new (base) HostBlockHeader{kMagic, n, capacity};
    void* data = static_cast<char*>(base) + kHostHeaderBytes;
    const std::size_t in_use = in_use_.fetch_add(n, std::memory_order_relaxed) + n;
    torch_compat::report_cpu_memory(data, static_cast<std::int64_t>(n), in_use);
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

#if KVMAP_C10_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  // The deleter of every DataPtr it made (the context is the data pointer).
  static void release(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHostHeaderBytes;
    const HostBlockHeader header = *static_cast<const HostBlockHeader*>(base);
    if (header.magic != kMagic) {
      std::fprintf(stderr, "kvmap host allocator: a block it did not make was given back to it\n");
      std::abort();
    }
    HostAllocator& a = instance();
    const std::size_t in_use =
        a.in_use_.fetch_sub(header.bytes, std::memory_order_relaxed) - header.bytes;
    torch_compat::report_cpu_memory(data, -static_cast<std::int64_t>(header.bytes), in_use);
    if (header.capacity == 0)
      c10::free_cpu(base);
    else
      a.cache_.give_back(HostRawBlock(base), header.capacity);
  }

  void install(std::size_t cache_bytes) {
    std::lock_guard<std::mutex> lock(install_mutex_);
    c10::Allocator* current = c10::GetCPUAllocator();
    cache_.clear(false);
    cache_.reopen(cache_bytes);
    small_.store(0);
    if (current == this) return;
    c10::SetCPUAllocator(this, 0);
    KVMAP_CHECK(c10::GetCPUAllocator() == this, Error,
                "kvmap: install_host_allocator: torch's CPU allocator slot is held by an "
                "allocator set with a higher priority; kvmap's host allocator is not installed");
    previous_ = current;
  }

  void uninstall() {
    std::lock_guard<std::mutex> lock(install_mutex_);
    if (c10::GetCPUAllocator() != this || previous_ == nullptr) return;
    c10::SetCPUAllocator(previous_, 0);
    previous_ = nullptr;
    cache_.clear(true);
  }

  HostAllocatorUsage usage() const {
    const BlockCacheCounts c = cache_.counts();
    HostAllocatorUsage u;
    u.installed = c10::GetCPUAllocator() == this;
    u.reused = c.reused;
    u.fresh = c.missed;
    u.small = small_.load(std::memory_order_relaxed);
    u.returned = c.dropped;
    u.bytes_kept = c.bytes_kept;
    u.bytes_kept_peak = c.bytes_kept_peak;
    u.bytes_in_use = in_use_.load(std::memory_order_relaxed);
    return u;
  }

 private:
  HostAllocator() = default;

  // mutable: allocate() is const on LibTorch < 2.3.
  mutable BlockCache<HostRawBlock> cache_{0};
  mutable std::atomic<std::uint64_t> small_{0};
  mutable std::atomic<std::size_t> in_use_{0};
  std::mutex install_mutex_;
  c10::Allocator* previous_ = nullptr;
};

// KVMAP_HOST_ALLOCATOR_MIB's cache size in bytes; nothing when unset or empty, 0 for "0".
// Throws kvmap::ValueError for anything but a whole number of MiB.
bool host_allocator_environment(std::size_t& bytes) {
  const char* env = std::getenv("KVMAP_HOST_ALLOCATOR_MIB");
  if (env == nullptr || *env == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long mib = std::strtoull(env, &end, 10);
  KVMAP_CHECK(*env >= '0' && *env <= '9' && *end == '\0' && errno == 0 &&
                  mib <= (std::numeric_limits<std::size_t>::max() >> 20),
              ValueError,
              "kvmap: KVMAP_HOST_ALLOCATOR_MIB=" << env
                                                 << " is not a whole number of MiB (the host "
                                                    "allocator's cache size; 0 turns it off)");
  bytes = static_cast<std::size_t>(mib) << 20;
  return mib > 0;
}

// At load time, for applications that never call into kvmap's start (ExaMiniMD's driver): a
// bad value is reported here and thrown by apply_host_allocator_environment.
[[maybe_unused]] const bool applied_at_load = [] {
  try {
    apply_host_allocator_environment();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  return true;
}();

}  // namespace

void apply_host_allocator_environment() {
  std::size_t bytes = 0;
  if (!host_allocator_environment(bytes)) return;
  static std::once_flag once;
  std::call_once(once, [bytes] { HostAllocator::instance().install(bytes); });
}

}  // namespace Detail

void install_host_allocator(const HostAllocatorOptions& options) {
  Detail::HostAllocator::instance().install(options.cache_bytes);
}

void uninstall_host_allocator() {
  Detail::HostAllocator::instance().uninstall();
}

HostAllocatorUsage host_allocator_usage() {
  return Detail::HostAllocator::instance().usage();
}

}  // namespace kvmap
