// Chunk sizes, chunks in flight and out-of-memory retries (chunk_sizing.hpp).
#include "chunk_sizing.hpp"

#include <ATen/Parallel.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <string>

#include "agreed_failure.hpp"
#include "kvmap/error.hpp"
#include "stats_counters.hpp"
#include "torch_compat.hpp"
#include "vmap_memory.hpp"

namespace kvmap::Detail {

namespace {

// A padded chunk cannot shrink: the program f runs was made for its shape.
[[noreturn]] void padded_out_of_memory(const VmapCall& call, std::int64_t rows,
                                       const std::exception_ptr& e) {
  throw OutOfMemoryError(std::string(call.who()) + ": a chunk padded to " + std::to_string(rows) +
                         " rows ran out of memory (" + message_of(e) +
                         "); pad_to_chunk keeps every chunk at that shape, so kvmap cannot run it "
                         "in halves: use a smaller chunk_size (e.g. " +
                         std::to_string(std::max<std::int64_t>(1, rows / 2)) +
                         ") for a program made for it");
}

}  // namespace

// Samples in the first probe chunk of chunk_size(auto_chunk): one, so that the probes stay
// within the budget unless a single sample does not fit it.
constexpr std::int64_t kProbeSamples = 1;

ChunkPlan initial_plan(const VmapOptions& o, std::int64_t n_local) {
  ChunkPlan p;
  p.pad = o.pad_to_chunk();
  if (o.auto_chunk_size()) {
    p.first = std::min(kProbeSamples, n_local);
    p.first_rows = p.first;
  } else {
    p.first = std::min(o.chunk_size().value_or(n_local), n_local);
    p.first_rows = o.chunk_size().value_or(n_local);
  }
  p.rest = p.first;
  p.rest_rows = p.first_rows;
  return p;
}

// The budget of chunk_size(auto_chunk): the user's, or read now.
std::int64_t memory_budget_now(const VmapCall& call) {
  if (call.options.memory_budget()) return *call.options.memory_budget();
  const std::optional<std::int64_t> budget = default_memory_budget(call.device);
  KVMAP_CHECK(budget, ValueError,
              call.who() << ": chunk_size=auto cannot read the free memory of "
                         << torch_device(call.device) << " in this build; give memory_budget");
  return *budget;
}

// How many chunks run at once. Chunks in flight at once run on the threads of the host
// execution space, each under the caller's torch thread-local state (grad mode, inference
// mode, dispatch keys, functorch layers). They stay on the calling thread, in order, where
// that is not possible: Same-mode randomness restores one generator state per chunk,
// LibTorch 1.13's functorch bookkeeping is not thread-safe (map_batches, which uses none,
// runs chunks at once there too), a host space with one thread gives no second chunk in
// flight, and on a GPU every chunk's torch work goes to the one Kokkos stream the calling
// thread set (torch_stream.hpp; the device runs each chunk's kernels in parallel).
int chunks_in_flight(const VmapCall& call) {
  if (call.options.randomness() == Randomness::Same ||
      (call.per_sample() && !torch_compat::concurrent_vmap_supported()) ||
      call.device.kind != DeviceKind::CPU) {
    return 1;
  }
  return std::min(call.options.concurrency(), Kokkos::DefaultHostExecutionSpace().concurrency());
}

// The chunk size that fits the budget, given what the probes measured. On the host also a
// chunk whose temporaries stay in cache (see host_chunk_working_set): each chunk in flight
// runs on one thread, a single one on torch's intra-op threads.
void choose_chunk(const VmapCall& call, ChunkPlan& plan, const std::vector<OutputMeta>& metas,
                  std::int64_t n_local, std::int64_t budget, const ProbedMemory& probed) {
  ChunkSizing sizing;
  sizing.budget = budget;
  if (probed.second_len > probed.first_len) {
    sizing.bytes_per_sample = std::max<std::int64_t>(
        0, (probed.second_peak - probed.first_peak + probed.second_len - probed.first_len - 1) /
               (probed.second_len - probed.first_len));
    sizing.bytes_per_chunk =
        std::max<std::int64_t>(0, probed.first_peak - sizing.bytes_per_sample * probed.first_len);
  } else if (probed.first_len > 0) {
    sizing.bytes_per_sample = (probed.first_peak + probed.first_len - 1) / probed.first_len;
  }
  for (const OutputMeta& m : metas) {
    std::int64_t per = static_cast<std::int64_t>(size_of(static_cast<DType>(m.dtype)));
    for (std::int32_t d = 0; d < m.ndim; ++d) per *= m.shape[d];
    sizing.output_bytes += per * n_local;
  }
  sizing.n_local = n_local;
  sizing.chunks_in_flight = chunks_in_flight(call);
  if (call.device.kind == DeviceKind::CPU) {
    sizing.working_set =
        host_chunk_working_set(sizing.chunks_in_flight > 1 ? 1 : at::get_num_threads());
  }
  plan.rest = chunk_for_budget(sizing);
  plan.rest_rows = plan.rest;
  record_auto_chunk(plan.rest, sizing.bytes_per_sample);
}

// Whether a chunk of `len` samples that threw `e` runs again as two halves; otherwise
// rethrows (an error that is not out of memory, one sample, or a padded chunk).
void halve_or_rethrow(const VmapCall& call, const ChunkPlan& plan, std::int64_t len,
                      std::int64_t padded_rows, const std::exception_ptr& e) {
  if (!out_of_memory(e) || len <= 1) std::rethrow_exception(e);
  if (plan.pad) padded_out_of_memory(call, padded_rows, e);
  count_chunk_retry();
}

}  // namespace kvmap::Detail
