#pragma once
// The memory torch allocates while a stretch of code runs, measured by the allocator rather
// than by kvmap: what tests and kvmap-perf compare kvmap's own measurement
// (chunk_size(auto_chunk)) and its budget against. Compiled into kvmap_internals only.
#include <c10/core/Device.h>

#include <cstdint>

#include "detail.hpp"

namespace kvmap::Detail {

// Peak of torch's live allocations on `device` above what was live when the meter started:
//  - host: a counting allocator installed in place of torch's CPU allocator while the meter
//    lives (it counts every allocation and free of every thread; the allocator it replaces
//    still does the allocating);
//  - a CUDA device (CUDA LibTorch): the caching allocator's own statistics (allocated bytes,
//    the peak reset when the meter starts), which count the rounded block sizes it hands out.
// One meter at a time per device; meters must not overlap.
class MemoryMeter {
 public:
  explicit MemoryMeter(c10::Device device);
  ~MemoryMeter();
  MemoryMeter(const MemoryMeter&) = delete;
  MemoryMeter& operator=(const MemoryMeter&) = delete;
  // Whether this build can measure memory on `device` (host always; CUDA with a CUDA LibTorch).
  static bool supported(c10::Device device);
  // The most bytes live at once since the meter started, minus those live at its start.
  std::int64_t peak_bytes() const;

 private:
  c10::Device device_;
  std::int64_t start_ = 0;
  void* previous_ = nullptr;  // the host allocator the counting one replaced
};

}  // namespace kvmap::Detail
