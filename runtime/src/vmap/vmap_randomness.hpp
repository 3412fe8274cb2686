#pragma once
// Randomness of one kvmap::vmap call: torch's generator per Randomness mode, and the
// per-sample streams behind kvmap::sample_uniform / sample_normal.
#include <ATen/core/Generator.h>

#include <cstdint>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "kvmap/vmap.hpp"

namespace kvmap::Detail {

// What sample_* need while the user function runs on one chunk (thread-local, set by the
// scheduler only; never visible to users).
struct SampleContext {
  static constexpr std::int64_t kPlain = -1;  // map_batches: plain [chunk, *shape] tensors
  std::int64_t level = 0;                     // functorch vmap level of the chunk, or kPlain
  std::int64_t global_offset = 0;             // global index of the chunk's first sample
  std::int64_t batch = 0;                     // samples in the chunk (padding included)
  std::int64_t rows = 0;                      // of those, real (kvmap::chunk_rows)
  std::uint64_t key = 0;                      // stream key of this vmap call
  std::int64_t calls = 0;                     // sample_* calls so far in this invocation of f
  DeviceSpec device;
};

class SampleContextGuard {
 public:
  explicit SampleContextGuard(SampleContext* context);
  ~SampleContextGuard();
  SampleContextGuard(const SampleContextGuard&) = delete;
  SampleContextGuard& operator=(const SampleContextGuard&) = delete;

 private:
  SampleContext* previous_;
};

// Torch's default generator of the device for the duration of one vmap call.
//  Same:      every chunk starts from `start` (the state the caller agreed on: every rank's
//             own, or rank 0's when they differed); afterwards every rank that started alike
//             moves on to the same new state.
//  Different: a per-rank stream derived from the (possibly identical) state and the rank;
//             afterwards every rank's generator moves on to the same new state.
//  Error:     untouched.
class GeneratorScope {
 public:
  GeneratorScope(Randomness mode, const Comm& comm, DeviceSpec device, const at::Tensor& start);
  ~GeneratorScope();
  GeneratorScope(const GeneratorScope&) = delete;
  GeneratorScope& operator=(const GeneratorScope&) = delete;
  void before_chunk();
  // The size of the device's generator state (part of Same mode's signature).
  static std::uint64_t state_bytes(DeviceSpec device);
  // A copy of the device generator's state (contiguous bytes), and its fingerprint.
  static at::Tensor current_state(DeviceSpec device);
  static std::uint64_t fingerprint(const at::Tensor& state);

 private:
  Randomness mode_;
  at::Generator generator_;
  at::Tensor synchronized_state_;
  std::uint64_t state_hash_ = 0;
};

}  // namespace kvmap::Detail
