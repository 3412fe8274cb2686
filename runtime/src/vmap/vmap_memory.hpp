#pragma once
// What a chunk of f costs in memory, and what a call may spend: the measurement behind
// chunk_size(auto_chunk), the default budget, and which exceptions mean "out of memory".
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>

#include "detail.hpp"
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

// What chunk_size(auto_chunk) weighs when it picks the chunk size after the probe.
struct ChunkSizing {
  std::int64_t budget = 0;            // bytes the call may spend on this rank
  std::int64_t bytes_per_sample = 0;  // what each sample of a chunk needs while f runs
  std::int64_t bytes_per_chunk = 0;   // what f needs per chunk whatever its length
  std::int64_t output_bytes = 0;      // the call's outputs, all samples
  std::int64_t n_local = 0;           // this rank's samples
  int chunks_in_flight = 1;           // chunks that run at once, each with its temporaries
  // Bytes one chunk's temporaries should stay within for speed (0: no preference): on the
  // host, a chunk whose temporaries leave the cache runs slower than smaller chunks.
  std::int64_t working_set = 0;
};

// Samples per chunk: the most whose temporaries (per chunk and per sample), times the chunks
// in flight, fit the budget with the outputs, and (with a working set) no more than fit the working
// set, unless that is fewer than kMinPreferredChunk; at least 1, at most n_local. Pure.
inline constexpr std::int64_t kMinPreferredChunk = 16;
std::int64_t chunk_for_budget(const ChunkSizing& s);

// The working set a host chunk should stay within: twice the L2 cache of one core for each
// thread torch runs the chunk on (`threads`), from the C library (sysconf), 1 MiB per core
// where it does not say.
std::int64_t host_chunk_working_set(int threads);

// Whether `e` says f ran out of memory: std::bad_alloc, c10::OutOfMemoryError, or
// kvmap::OutOfMemoryError (what the front-ends raise for their languages' own).
bool out_of_memory(const std::exception_ptr& e);

}  // namespace kvmap::Detail
