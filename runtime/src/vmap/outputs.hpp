#pragma once
// The outputs of a call (vmap, map_batches, map_overlap) as the parts of DistViews: adopted
// without aliasing (an output never shares memory with an input or another output), their
// layouts from the lead array's, and, after the agreement, assembled (a zero-byte block where
// a rank ran no function).
#include <ATen/core/Tensor.h>

#include <vector>

#include "detail.hpp"
#include "dist_view_access.hpp"
#include "kvmap/layout.hpp"
#include "local_block.hpp"
#include "tensor_blocks.hpp"
#include "vmap_agreement.hpp"
#include "vmap_call.hpp"

namespace kvmap::Detail {

// One output DistView's parts: its block, dtype and layout.
struct OutputArray {
  LocalBlock block;
  DType dtype;
  Layout layout;
};

// The outputs of a call run as one piece, adopted as they are, unless a stride-0 broadcast
// has to be materialized once, or an output shares memory with a tensor argument, an array
// argument or an earlier output ({t, t}): then it is copied (counted in bytes_copied).
void adopt_unaliased(std::vector<at::Tensor>& outputs, const std::vector<MemorySpan>& tensor_spans,
                     const std::vector<ArrayArg>& arrays);

// Output m's layout: the lead's counts along its out_dim, its per-sample shape elsewhere.
Layout output_layout(const Layout& lead, const OutputMeta& m);

// After the agreement; cannot fail (zero-byte blocks on ranks that ran no function). `region`
// names the step for Kokkos Tools (the calling front-end's, e.g. "kvmap::vmap/assemble").
std::vector<OutputArray> assemble(std::vector<LocalBlock>& blocks,
                                  const std::vector<OutputMeta>& metas, const Layout& lead,
                                  bool ran, int me, Allocate allocate, const char* region);

// A call's DistView arguments as the scheduler sees them (their own blocks and layouts,
// alive for the call).
template <class M>
std::vector<ArrayArg> array_args(const DistView<M>* const* arrays, std::size_t count) {
  std::vector<ArrayArg> args;
  args.reserve(count);
  for (std::size_t k = 0; k < count; ++k) {
    const DistView<M>& a = *arrays[k];
    args.push_back({DistViewAccess::block(a), a.dtype(), a.layout(), a.comm().id()});
  }
  return args;
}

// The memory of a call's defined tensor arguments: what no output may share.
std::vector<MemorySpan> tensor_spans(const std::vector<at::Tensor>& tensors);

// The assembled outputs as DistViews over comm (agreed parts: no communication, no checks).
template <class M>
std::vector<DistView<M>> to_dist_views(std::vector<OutputArray>& result, const Comm& comm) {
  std::vector<DistView<M>> outputs;
  outputs.reserve(result.size());
  for (OutputArray& out : result) {
    outputs.push_back(
        DistViewAccess::make<M>(std::move(out.layout), out.dtype, comm, std::move(out.block)));
  }
  return outputs;
}

}  // namespace kvmap::Detail
