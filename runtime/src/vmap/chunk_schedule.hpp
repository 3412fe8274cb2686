#pragma once
// This rank's chunks, in order: chunk 0 (it fixes the outputs' metadata, and is the first
// probe of chunk_size(auto_chunk)), the second probe, then the remaining chunks, several in
// flight where that is safe. A chunk that runs out of memory runs again in halves. Outputs are
// adopted unchunked, or preallocated once and written chunk by chunk. Makes no MPI call.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "chunk_runner.hpp"
#include "detail.hpp"
#include "vmap_agreement.hpp"
#include "vmap_call.hpp"

namespace kvmap::Detail {

// What running f on this rank's chunks gives.
struct ChunkResults {
  std::vector<OutputMeta> metas;    // each output's per-sample metadata (chunk 0's)
  std::vector<at::Tensor> outputs;  // physical, the local batch along each out_dim
  std::int64_t chunks = 0;          // chunks run (halves of a retried chunk not counted)
};

// Runs f on this rank's n_local samples (n_local 0 only for an empty batch: f runs once, on
// none).
ChunkResults run_chunks(const VmapCall& call, std::int64_t n_local, const ChunkRunner& runner);

}  // namespace kvmap::Detail
