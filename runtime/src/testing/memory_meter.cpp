#include "memory_meter.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include "torch_compat.hpp"

#if defined(KVMAP_TORCH_CUDA) && !defined(USE_ROCM)
#include <c10/cuda/CUDACachingAllocator.h>
#define KVMAP_METER_CUDA 1
#endif

#include <atomic>
#include <stdexcept>
#include <string>

namespace kvmap::Detail {

namespace {

// Counts what torch's CPU allocator hands out and is not yet freed, and the peak of that,
// across all threads. One instance for the process, never destroyed: memory it handed out
// may be freed after the meter that installed it is gone.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static CountingCpuAllocator& instance() {
    static auto* the = new CountingCpuAllocator();  // never destroyed (see above)
    return *the;
  }
  void wrap(c10::Allocator* inner) { inner_ = inner; }

  c10::DataPtr allocate(std::size_t n) KVMAP_C10_ALLOCATE_CONST override {
    auto* held = new Held{inner_->allocate(n), static_cast<std::int64_t>(n), this};
    const std::int64_t now = live_.fetch_add(held->bytes) + held->bytes;
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    void* data = held->inner.get();
    return {data, held, &release, c10::Device(c10::DeviceType::CPU)};
  }
#if KVMAP_C10_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  std::int64_t live() const {
    return live_.load();
  }
  std::int64_t peak() const {
    return peak_.load();
  }
  void reset_peak() {
    peak_ = live_.load();
  }

 private:
  struct Held {
    c10::DataPtr inner;
    std::int64_t bytes;
    const CountingCpuAllocator* owner;
  };
  static void release(void* context) {
    auto* held = static_cast<Held*>(context);
    held->owner->live_ -= held->bytes;
    delete held;
  }
  CountingCpuAllocator() = default;
  c10::Allocator* inner_ = nullptr;
  mutable std::atomic<std::int64_t> live_{0};
  mutable std::atomic<std::int64_t> peak_{0};
};

#if KVMAP_METER_CUDA
// The caching allocator's allocated bytes, all pools together (entry 0, "aggregate", in every
// LibTorch 2.x; the stats' type moved between namespaces across versions).
struct Allocated {
  std::int64_t current, peak;
};
Allocated allocated(c10::DeviceIndex index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return {stats.allocated_bytes[0].current, stats.allocated_bytes[0].peak};
}
#endif

}  // namespace

bool MemoryMeter::supported(c10::Device device) {
#if KVMAP_METER_CUDA
  if (device.is_cuda()) return true;
#endif
  return device.is_cpu();
}

MemoryMeter::MemoryMeter(c10::Device device) : device_(device) {
  if (!supported(device)) {
    throw std::invalid_argument("kvmap: MemoryMeter cannot measure memory on " + device.str() +
                                " in this build");
  }
  if (device.is_cpu()) {
    CountingCpuAllocator& counting = CountingCpuAllocator::instance();
    c10::Allocator* previous = c10::GetCPUAllocator();
    previous_ = previous;
    counting.wrap(previous);
    c10::SetCPUAllocator(&counting, 255);
    start_ = counting.live();
    counting.reset_peak();
    return;
  }
#if KVMAP_METER_CUDA
  const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
  device_ = c10::Device(c10::DeviceType::CUDA, index);
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
  start_ = allocated(index).current;
#endif
}

MemoryMeter::~MemoryMeter() {
  if (device_.is_cpu()) c10::SetCPUAllocator(static_cast<c10::Allocator*>(previous_), 255);
}

std::int64_t MemoryMeter::peak_bytes() const {
  if (device_.is_cpu()) return CountingCpuAllocator::instance().peak() - start_;
#if KVMAP_METER_CUDA
  return allocated(device_.index()).peak - start_;
#else
  return 0;  // unreachable: the constructor refused other devices
#endif
}

}  // namespace kvmap::Detail
