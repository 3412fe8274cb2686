#pragma once
// Runs f on one chunk of this rank's samples: the chunk's inputs (padded where asked), batched
// at functorch's level (vmap) or as plain tensors (map_batches), f under the per-sample random
// context, and each output checked against the first chunk's metadata and moved to its
// out_dim. Chunk 0 fixes the outputs' metadata; later chunks are checked against it.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "detail.hpp"
#include "torch_compat.hpp"
#include "vmap_agreement.hpp"
#include "vmap_call.hpp"
#include "vmap_randomness.hpp"

namespace kvmap::Detail {

torch_compat::VmapRandomness to_compat(Randomness r);

class ChunkRunner {
 public:
  ChunkRunner(const VmapCall& call, const std::vector<at::Tensor>& locals,
              GeneratorScope& generator, std::int64_t global_offset, std::uint64_t sample_key)
      : call_(call),
        locals_(locals),
        generator_(generator),
        global_offset_(global_offset),
        sample_key_(sample_key) {}

  // Runs f on samples [start, start + len) and returns each output with its batch moved to
  // its normalized out_dim. Chunk 0 fills `metas` (passed empty); later chunks check
  // their outputs against it.
  // `padded` >= len: the rows f sees (map_batches with pad_to_chunk), the last real row
  // repeated; only the real rows' outputs are returned.
  std::vector<at::Tensor> run_first(std::int64_t len, std::int64_t padded,
                                    std::vector<OutputMeta>& metas) const {
    return run_checked(0, len, padded, &metas, metas);
  }
  std::vector<at::Tensor> run_next(std::int64_t start, std::int64_t len, std::int64_t padded,
                                   const std::vector<OutputMeta>& expected) const {
    return run_checked(start, len, padded, nullptr, expected);
  }

 private:
  std::vector<at::Tensor> run_checked(std::int64_t start, std::int64_t len, std::int64_t padded,
                                      std::vector<OutputMeta>* record,
                                      const std::vector<OutputMeta>& metas) const;

  // Mapped arrays: this chunk's samples, padded to `padded` rows with copies of the last
  // (a new tensor, counted in bytes_copied); replicated ones: the whole shard.
  std::vector<at::Tensor> chunk_inputs(std::int64_t start, std::int64_t len,
                                       std::int64_t padded) const;

  // In place: the batch at functorch's level, or moved first (a view) for map_batches.
  void batch(std::vector<at::Tensor>& inputs, std::optional<torch_compat::VmapLevel>& level) const;

  std::vector<at::Tensor> call_f(const std::vector<at::Tensor>& batched,
                                 const std::optional<torch_compat::VmapLevel>& level,
                                 std::int64_t start, std::int64_t len, std::int64_t padded) const;

  // Output k's per-sample metadata, checked: defined, on the call's device, within kvmap's
  // rank limit, and for map_batches leading with the chunk's samples.
  OutputMeta output_meta(const at::Tensor& r, std::size_t k, std::size_t nout, std::int64_t start,
                         std::int64_t len) const;

  // Physical from now on: the batch along out_dim. A DistView holds data, not autograd
  // history: outputs computed with grad mode on (a model whose parameters require grad) are
  // detached.
  static void to_physical(at::Tensor& r, const OutputMeta& m,
                          std::optional<torch_compat::VmapLevel>& level);

  const VmapCall& call_;
  const std::vector<at::Tensor>& locals_;  // zero-copy views of every array's local shard
  GeneratorScope& generator_;
  std::int64_t global_offset_;
  std::uint64_t sample_key_;
};

}  // namespace kvmap::Detail
