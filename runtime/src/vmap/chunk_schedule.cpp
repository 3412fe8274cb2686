// This rank's chunks in order (chunk_schedule.hpp).
#include "chunk_schedule.hpp"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>

#include "allocation.hpp"
#include "chunk_sizing.hpp"
#include "outputs.hpp"
#include "kvmap/tensor_bridge.hpp"
#include "stats_counters.hpp"
#include "tensor_blocks.hpp"
#include "vmap_memory.hpp"

namespace kvmap::Detail {

namespace {

// Runs body(c) for chunks 1 .. nchunks - 1, `in_flight` at once, until `failed`.
template <class Body>
void for_each_later_chunk(std::int64_t nchunks, int in_flight, const std::atomic<bool>& failed,
                          const Body& body) {
  if (in_flight <= 1) {
    // Plain loop: the user function may call Kokkos itself (a dispatch or fence inside a
    // Kokkos policy would wait on that policy's own lock).
    for (std::int64_t c = 1; c < nchunks && !failed.load(); ++c) {
      ScopedRegion region("kvmap::vmap/chunk");
      body(c);
    }
    return;
  }
  using Host = Kokkos::DefaultHostExecutionSpace;
  const at::ThreadLocalState caller_state;
  auto body_in_caller_state = [&](const std::int64_t c) {
    at::ThreadLocalStateGuard state_guard(caller_state);
    body(c);
  };
  for (std::int64_t wave = 1; wave < nchunks && !failed.load(); wave += in_flight) {
    const std::int64_t end = std::min<std::int64_t>(nchunks, wave + in_flight);
    // One chunk per thread (static, chunk size 1): a wave's chunks run at once. Regions are
    // pushed by the calling thread only: Kokkos >= 4 fences every execution space on a
    // region push while a profiler is attached, which inside the policy waits on the policy.
    ScopedRegion region("kvmap::vmap/chunk");
    Kokkos::parallel_for(
        "kvmap::vmap/chunks",
        Kokkos::RangePolicy<Host, Kokkos::Schedule<Kokkos::Static>,
                            Kokkos::IndexType<std::int64_t>>(wave, end, Kokkos::ChunkSize(1)),
        body_in_caller_state);
    Host().fence();
  }
}

// One rank's run of f over its chunks, the state the steps share.
class ChunkSchedule {
 public:
  ChunkSchedule(const VmapCall& call, std::int64_t n_local, const ChunkRunner& runner)
      : call_(call),
        runner_(runner),
        n_local_(n_local),
        plan_(initial_plan(call.options, n_local)),
        automatic_(call.options.auto_chunk_size()),
        budget_(automatic_ ? memory_budget_now(call) : 0) {}

  ChunkResults run() {
    std::vector<at::Tensor> first = run_first_chunk();
    results_.chunks = 1;
    if (plan_.first == n_local_) {
      adopt_unaliased(first, call_.tensor_spans, call_.arrays);
      results_.outputs = std::move(first);
      return std::move(results_);
    }
    preallocate();
    write(0, first);
    first.clear();
    done_ = plan_.first;
    if (automatic_ && plan_.rest > 1) run_second_probe();
    if (done_ < n_local_) run_remaining_chunks();
    return std::move(results_);
  }

 private:
  // Chunk 0: run, and on out of memory run again on its first half until it fits. plan_.first
  // ends as the samples it ran; for chunk_size(auto_chunk) it is the first probe, and what
  // fit decides the chunk size from now on.
  std::vector<at::Tensor> run_first_chunk() {
    ScopedRegion region("kvmap::vmap/chunk");
    std::vector<at::Tensor> first;
    for (;;) {
      std::exception_ptr failure;
      try {
        std::optional<MemoryProbe> probe;
        if (automatic_) probe.emplace();
        first = runner_.run_first(plan_.first, plan_.rows(plan_.first, plan_.first_rows),
                                  results_.metas);
        if (automatic_) probed_.first_peak = probe->peak_bytes();
        break;
      } catch (...) {
        failure = std::current_exception();
      }
      halve_or_rethrow(call_, plan_, plan_.first, plan_.first_rows, failure);
      failure = nullptr;  // released (a Python traceback holds the chunk's tensors) first
      results_.metas.clear();
      plan_.first /= 2;
      plan_.first_rows = plan_.first;
    }
    probed_.first_len = plan_.first;
    if (automatic_) {
      choose_chunk(call_, plan_, results_.metas, n_local_, budget_, probed_);
    } else if (plan_.first < plan_.rest) {
      plan_.rest = plan_.rest_rows = plan_.first;  // what fit chunk 0 is the chunk size now
    }
    return first;
  }

  // The outputs, allocated once in the DistViews' memory space; every chunk writes its slice.
  void preallocate() {
    for (const OutputMeta& m : results_.metas) {
      Shape shape(m.shape, m.shape + m.ndim);
      shape.insert(shape.begin() + m.out_dim, n_local_);
      const DType dt = static_cast<DType>(m.dtype);
      results_.outputs.push_back(
          tensor_from_block(call_.allocate(shape, size_of(dt)), dt, call_.device));
    }
  }

  void write(std::int64_t start, const std::vector<at::Tensor>& chunk) {
    for (std::size_t k = 0; k < chunk.size(); ++k) {
      const std::int64_t dim = results_.metas[k].out_dim;
      results_.outputs[k].narrow(dim, start, chunk[k].size(dim)).copy_(chunk[k]);
      count_bytes_copied(static_cast<std::uint64_t>(chunk[k].numel()) * chunk[k].element_size());
    }
  }

  // Samples [start, start + len), in halves while f runs out of memory; with `fitted`, the
  // shortest length that ran is kept there.
  void run_in_halves(std::int64_t start, std::int64_t len, std::int64_t* fitted) {
    std::exception_ptr failure;
    try {
      write(start, runner_.run_next(start, len, plan_.rows(len, plan_.rest_rows), results_.metas));
      if (fitted) *fitted = std::min(*fitted, len);
      return;
    } catch (...) {
      failure = std::current_exception();
    }
    halve_or_rethrow(call_, plan_, len, plan_.rest_rows, failure);
    failure = nullptr;
    run_in_halves(start, len / 2, fitted);
    run_in_halves(start + len / 2, len - len / 2, fitted);
  }

  // chunk_size(auto_chunk)'s second probe: chunk 1, of the size chunk 0 allowed, measured on
  // this thread; its peak against chunk 0's gives the chunk size of the rest.
  void run_second_probe() {
    ScopedRegion region("kvmap::vmap/chunk");
    probed_.second_len = std::min(plan_.rest, n_local_ - done_);
    std::int64_t fitted = probed_.second_len;
    {
      MemoryProbe probe;
      run_in_halves(done_, probed_.second_len, &fitted);
      probed_.second_peak = probe.peak_bytes();
    }
    done_ += probed_.second_len;
    results_.chunks += 1;
    if (fitted == probed_.second_len) {
      choose_chunk(call_, plan_, results_.metas, n_local_, budget_, probed_);
    } else {  // it did not fit as a whole: what did is the chunk size from now on
      plan_.rest = plan_.rest_rows = fitted;
      record_auto_chunk(fitted, probed_.first_len > 0 ? probed_.first_peak / probed_.first_len : 0);
    }
  }

  // Samples [done_, n_local) by plan_.rest, chunks_in_flight() at once. After a failure no
  // further chunk starts (those in flight finish); the error of the lowest failing chunk is
  // rethrown once all have completed.
  void run_remaining_chunks() {
    const std::int64_t nchunks = 1 + (n_local_ - done_ + plan_.rest - 1) / plan_.rest;
    results_.chunks += nchunks - 1;
    std::mutex error_mutex;
    std::int64_t failed_chunk = nchunks;
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    auto body = [&](const std::int64_t chunk) {
      if (failed.load()) return;
      try {
        const std::int64_t start = done_ + (chunk - 1) * plan_.rest;
        run_in_halves(start, std::min(plan_.rest, n_local_ - start), nullptr);
      } catch (...) {
        failed.store(true);
        // A replaced error is released after the lock (its destructor may wait for the GIL).
        std::exception_ptr mine = std::current_exception();
        std::lock_guard<std::mutex> lock(error_mutex);
        if (chunk < failed_chunk) {
          failed_chunk = chunk;
          std::swap(error, mine);
        }
      }
    };
    for_each_later_chunk(nchunks, chunks_in_flight(call_), failed, body);
    if (error) std::rethrow_exception(error);
  }

  const VmapCall& call_;
  const ChunkRunner& runner_;
  std::int64_t n_local_;
  ChunkPlan plan_;
  bool automatic_;
  std::int64_t budget_;
  ProbedMemory probed_;
  ChunkResults results_;
  std::int64_t done_ = 0;  // samples written
};

}  // namespace

ChunkResults run_chunks(const VmapCall& call, std::int64_t n_local, const ChunkRunner& runner) {
  return ChunkSchedule(call, n_local, runner).run();
}

}  // namespace kvmap::Detail
