#pragma once
// How one rank's samples are cut into chunks: fixed chunk sizes, or chunk_size(auto_chunk)'s
// probes and the chunk size that fits the memory budget (what f needs per sample and per chunk,
// vmap_memory.hpp), how many chunks run at once, and whether a chunk that ran out of memory
// runs again in halves.
#include <cstdint>
#include <exception>
#include <vector>

#include "detail.hpp"
#include "vmap_agreement.hpp"
#include "vmap_call.hpp"

namespace kvmap::Detail {

// How one rank's samples are cut: chunk 0 of `first` samples (it fixes the outputs' metadata
// and, for chunk_size(auto_chunk), is the probe), then chunks of `rest`. With pad_to_chunk
// f sees `first_rows` and `rest_rows` rows, else as many as are real.
struct ChunkPlan {
  std::int64_t first = 0;
  std::int64_t rest = 0;
  bool pad = false;
  std::int64_t first_rows = 0;
  std::int64_t rest_rows = 0;
  std::int64_t rows(std::int64_t len, std::int64_t padded) const {
    return pad && len > 0 ? padded : len;
  }
};

// The plan before anything ran: chunk 0 is the probe of chunk_size(auto_chunk), or the first
// fixed-size chunk (or the whole shard).
ChunkPlan initial_plan(const VmapOptions& o, std::int64_t n_local);

// What chunk_size(auto_chunk) measured: the peak of chunk 0 (one sample), and of chunk 1 (the
// chunk size chunk 0 allowed, as if each sample cost what chunk 0 cost), which separates what
// f needs per sample from what it needs per chunk (the slope and the intercept).
struct ProbedMemory {
  std::int64_t first_peak = 0, first_len = 0;
  std::int64_t second_peak = 0, second_len = 0;  // second_len 0: no second probe
};

// The budget of chunk_size(auto_chunk): the user's, or read now.
std::int64_t memory_budget_now(const VmapCall& call);

// Sets plan.rest (and rest_rows) to the chunk size that fits the budget, given what the probes
// measured and the outputs' size; records it in stats().
void choose_chunk(const VmapCall& call, ChunkPlan& plan, const std::vector<OutputMeta>& metas,
                  std::int64_t n_local, std::int64_t budget, const ProbedMemory& probed);

// How many chunks run at once: several on the host threads where that is safe (see
// chunk_sizing.cpp), else one.
int chunks_in_flight(const VmapCall& call);

// Whether a chunk of `len` samples that threw `e` runs again as two halves (counted);
// otherwise rethrows (an error that is not out of memory, one sample, or a padded chunk).
void halve_or_rethrow(const VmapCall& call, const ChunkPlan& plan, std::int64_t len,
                      std::int64_t padded_rows, const std::exception_ptr& e);

}  // namespace kvmap::Detail
