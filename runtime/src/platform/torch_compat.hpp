#pragma once
// The only interface to LibTorch's functorch internals (ATen/functorch/*), and to the parts of
// c10's allocator interface that changed between versions. LibTorch 1.13 and 2.x differ there
// (int64 vs SymInt batch sizes, an unlocked process-global map of layer life handles in 1.13,
// the memory reporting's totals, c10::Allocator's const-ness); every difference stays behind
// this header, in torch_compat.cpp and the two macros below.
#include <ATen/core/Tensor.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "detail.hpp"

// For the allocators kvmap puts in torch's CPU slot (host_allocator.cpp, and the tests'
// counting allocator, testing/memory_meter.cpp): LibTorch 2.3 made c10::Allocator::allocate
// non-const and requires copy_data(); 1.13 has a const allocate() and no copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
// Written after `allocate(std::size_t n)` in a derived c10::Allocator.
#define KVMAP_C10_ALLOCATE_CONST
// Whether c10::Allocator declares copy_data (pure virtual) and default_copy_data.
#define KVMAP_C10_ALLOCATOR_COPY_DATA 1
#else
#define KVMAP_C10_ALLOCATE_CONST const
#define KVMAP_C10_ALLOCATOR_COPY_DATA 0
#endif

namespace kvmap::Detail::torch_compat {

enum class VmapRandomness { Error, Same, Different };

// One functorch vmap level: pushed on construction, popped on destruction (also when the
// user function throws). Construct only while holding vmap_region_lock().
class VmapLevel {
 public:
  VmapLevel(std::int64_t batch_size, VmapRandomness randomness);
  ~VmapLevel();
  VmapLevel(const VmapLevel&) = delete;
  VmapLevel& operator=(const VmapLevel&) = delete;

  std::int64_t level() const { return level_; }
  std::int64_t batch_size() const { return batch_size_; }

  // Marks dim `dim` of a physical tensor as this level's batch dimension.
  at::Tensor add_batch_dim(const at::Tensor& physical, std::int64_t dim) const;
  // The physical tensor with this level's batch dimension moved to `out_dim` (>= 0, already
  // normalized); outputs that do not depend on the batch are expanded (stride 0).
  at::Tensor remove_batch_dim(const at::Tensor& result, std::int64_t out_dim) const;
  // True when `t` carries this level's batch dimension.
  bool is_batched_here(const at::Tensor& t) const;

 private:
  std::int64_t level_ = 0;
  std::int64_t batch_size_ = 0;
};

// Held around a whole vmap region (push .. pop). On LibTorch < 2.0 it serializes vmap
// regions across threads, because functorch's layer bookkeeping there is a process-global
// map without a lock; on 2.x it does not block.
std::unique_lock<std::recursive_mutex> vmap_region_lock();
// Whether vmap regions run concurrently on this LibTorch.
bool concurrent_vmap_supported();

// A physical tensor of per-sample values wrapped as batched at `level` along dim 0.
at::Tensor make_batched(const at::Tensor& physical, std::int64_t level);

// Torch's memory reporting (the hook torch's profiler uses) on this thread for the life of
// the object: on_change(bytes) for each allocation (> 0) and free (< 0) that torch's
// allocators report for tensors of this thread. The hook's signature differs between
// LibTorch 1.13 and 2.x. Restores the thread's previous reporter (a profiler's) at the end.
class MemoryReporting {
 public:
  explicit MemoryReporting(std::function<void(std::int64_t)> on_change);
  ~MemoryReporting();
  MemoryReporting(const MemoryReporting&) = delete;
  MemoryReporting& operator=(const MemoryReporting&) = delete;

 private:
  std::shared_ptr<void> installed_;
};

// Reports an allocation (bytes > 0) or a free (< 0) of CPU memory at `data` to torch's memory
// reporting (the profiler's, MemoryReporting's) where this thread has one, as c10's own CPU
// allocator does; `in_use` is the allocator's total after it.
void report_cpu_memory(void* data, std::int64_t bytes, std::size_t in_use);

}  // namespace kvmap::Detail::torch_compat
