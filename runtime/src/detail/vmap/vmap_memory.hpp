#pragma once
// What a chunk of f costs in memory, and what a call may spend: the measurement behind
// chunk_size(auto_chunk), the default budget, and which exceptions mean "out of memory".
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>

#include "detail/detail.hpp"
#include "kvmap/impl/kokkos_compat.hpp"

namespace kvmap::Detail {

// What torch allocates on this thread while a probe is alive, through torch's own memory
// reporting (c10::MemoryReportingInfoBase, the hook torch's profiler uses, installed as this
// thread's debug info): every allocation and free of torch's CPU allocator and the CUDA
// caching allocator made by tensors of this thread. Frees of memory allocated before the
// probe are not seen, so the peak is what f needs above what existed. Torch's CPU allocator
// logs a warning when such a free happens (at most once per 1,000).
class MemoryProbe {
 public:
  MemoryProbe();
  ~MemoryProbe();
  MemoryProbe(const MemoryProbe&) = delete;
  MemoryProbe& operator=(const MemoryProbe&) = delete;
  // The largest number of bytes allocated and not yet freed at once since the probe started.
  std::int64_t peak_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// The bytes a call may spend on this rank when the user gave no memory_budget: half of the
// host's MemAvailable divided among the node's ranks (host memory), 80% of the device's free
// memory (a CUDA device, with a CUDA LibTorch); std::nullopt where this build cannot read it.
std::optional<std::int64_t> default_memory_budget(DeviceSpec device);

// Samples per chunk that fit `budget` bytes, given what one sample needs while f runs and
// what the call's outputs take in all: at least 1, at most `n_local`. Pure.
std::int64_t chunk_for_budget(std::int64_t budget, std::int64_t bytes_per_sample,
                              std::int64_t output_bytes, std::int64_t n_local);

// Whether `e` says f ran out of memory: std::bad_alloc, c10::OutOfMemoryError, or
// kvmap::OutOfMemoryError (what the front-ends raise for their languages' own).
bool out_of_memory(const std::exception_ptr& e);

}  // namespace kvmap::Detail
