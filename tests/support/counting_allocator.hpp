#pragma once
// A CPU allocator for torch that counts what is allocated and not yet freed, and the peak of
// that, across all threads: installed in place of torch's CPU allocator while a
// CountingCpuAllocator::Scope lives (tests measure a call's memory with it, independently of
// kvmap's own measurement). One instance for the process, never destroyed: memory it handed
// out may be freed after the scope.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace kvmap_test {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define KVMAP_TEST_ALLOCATE_CONST
#define KVMAP_TEST_ALLOCATOR_COPY_DATA 1
#else
#define KVMAP_TEST_ALLOCATE_CONST const
#define KVMAP_TEST_ALLOCATOR_COPY_DATA 0
#endif

class CountingCpuAllocator final : public c10::Allocator {
 public:
  static CountingCpuAllocator& instance() {
    static auto* the = new CountingCpuAllocator();  // never destroyed (see above)
    return *the;
  }
  // Torch's CPU allocations go through the counting allocator while a Scope lives.
  class Scope {
   public:
    Scope() : previous_(c10::GetCPUAllocator()) {
      instance().inner_ = previous_;
      c10::SetCPUAllocator(&instance(), 255);
    }
    ~Scope() { c10::SetCPUAllocator(previous_, 255); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    c10::Allocator* previous_;
  };

  c10::DataPtr allocate(std::size_t n) KVMAP_TEST_ALLOCATE_CONST override {
    auto* held = new Held{inner_->allocate(n), static_cast<std::int64_t>(n), this};
    const std::int64_t now = live_.fetch_add(held->bytes) + held->bytes;
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    void* data = held->inner.get();
    return {data, held, &release, c10::Device(c10::DeviceType::CPU)};
  }
#if KVMAP_TEST_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  // Bytes allocated through this allocator and not freed now; the most at once since the
  // last reset_peak() (or construction).
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

}  // namespace kvmap_test
