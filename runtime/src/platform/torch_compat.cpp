#include "torch_compat.hpp"

#include <ATen/ATen.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <ATen/functorch/DynamicLayer.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/version.h>

#include "kvmap/error.hpp"

namespace kvmap::Detail::torch_compat {

namespace functorch = at::functorch;

namespace {
functorch::RandomnessType to_functorch(VmapRandomness r) {
  switch (r) {
    case VmapRandomness::Error: return functorch::RandomnessType::Error;
    case VmapRandomness::Same: return functorch::RandomnessType::Same;
    case VmapRandomness::Different: return functorch::RandomnessType::Different;
  }
  return functorch::RandomnessType::Error;
}

std::recursive_mutex g_vmap_region_mutex;
}  // namespace

VmapLevel::VmapLevel(std::int64_t batch_size, VmapRandomness randomness) : batch_size_(batch_size) {
#if TORCH_VERSION_MAJOR >= 2
  level_ = functorch::initAndPushDynamicLayer(functorch::TransformType::Vmap,
                                              c10::SymInt(batch_size), to_functorch(randomness));
#else
  level_ = functorch::initAndPushDynamicLayer(functorch::TransformType::Vmap, batch_size,
                                              to_functorch(randomness));
#endif
}

VmapLevel::~VmapLevel() {
  functorch::popDynamicLayerAndDeleteMetadata();
}

at::Tensor VmapLevel::add_batch_dim(const at::Tensor& physical, std::int64_t dim) const {
  return functorch::addBatchDim(physical, dim, level_);
}

bool VmapLevel::is_batched_here(const at::Tensor& t) const {
  const auto* batched = functorch::maybeGetBatchedImpl(t);
  return batched != nullptr && batched->level() >= level_;
}

at::Tensor VmapLevel::remove_batch_dim(const at::Tensor& result, std::int64_t out_dim) const {
  const auto* batched = functorch::maybeGetBatchedImpl(result);
  if (batched == nullptr || batched->level() < level_) {
    // Independent of the batch: every sample sees the same value.
    std::vector<std::int64_t> sizes = result.sizes().vec();
    KVMAP_CHECK(out_dim >= 0 && out_dim <= static_cast<std::int64_t>(sizes.size()), ValueError,
                "kvmap::vmap: out_dim " << out_dim << " out of range for an output of "
                                        << sizes.size() << " dimensions");
    sizes.insert(sizes.begin() + out_dim, batch_size_);
    return result.unsqueeze(out_dim).expand(sizes);
  }
  KVMAP_CHECK(batched->level() == level_, ValueError,
              "kvmap::vmap: the function returned a tensor batched at an inner vmap level ("
                  << batched->level() << ", kvmap's is " << level_
                  << "); return values must not escape nested vmaps");
  const at::Tensor& physical = batched->value();
  KVMAP_CHECK(out_dim >= 0 && out_dim < physical.dim(), ValueError,
              "kvmap::vmap: out_dim " << out_dim << " out of range for an output of "
                                      << physical.dim() - 1 << " dimensions per sample");
  if (batched->bdim() == out_dim) return physical;
  return physical.movedim(batched->bdim(), out_dim);
}

std::unique_lock<std::recursive_mutex> vmap_region_lock() {
  if (concurrent_vmap_supported()) return std::unique_lock<std::recursive_mutex>();
  return std::unique_lock<std::recursive_mutex>(g_vmap_region_mutex);
}

bool concurrent_vmap_supported() {
  return TORCH_VERSION_MAJOR >= 2;
}

at::Tensor make_batched(const at::Tensor& physical, std::int64_t level) {
  return functorch::addBatchDim(physical, 0, level);
}

namespace {
class Reporter final : public c10::MemoryReportingInfoBase {
 public:
  explicit Reporter(std::function<void(std::int64_t)> on_change)
      : on_change_(std::move(on_change)) {}
  bool memoryProfilingEnabled() const override { return true; }
#if TORCH_VERSION_MAJOR >= 2
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device /*device*/) override {
    on_change_(alloc_size);
  }
#else
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, int64_t /*total_allocated*/,
                         int64_t /*total_reserved*/, c10::Device /*device*/) override {
    on_change_(alloc_size);
  }
#endif

 private:
  std::function<void(std::int64_t)> on_change_;
};
}  // namespace

MemoryReporting::MemoryReporting(std::function<void(std::int64_t)> on_change)
    : installed_(std::make_shared<c10::DebugInfoGuard>(
          c10::DebugInfoKind::PROFILER_STATE, std::make_shared<Reporter>(std::move(on_change)))) {}

MemoryReporting::~MemoryReporting() = default;

void report_cpu_memory(void* data, std::int64_t bytes, std::size_t in_use) {
  if (!c10::memoryProfilingEnabled()) return;
#if TORCH_VERSION_MAJOR >= 2
  c10::reportMemoryUsageToProfiler(data, bytes, in_use, 0, c10::Device(c10::DeviceType::CPU));
#else
  c10::reportMemoryUsageToProfiler(data, bytes, static_cast<std::int64_t>(in_use), 0,
                                   c10::Device(c10::DeviceType::CPU));
#endif
}

}  // namespace kvmap::Detail::torch_compat
