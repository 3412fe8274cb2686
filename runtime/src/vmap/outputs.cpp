// The outputs of a call as the parts of DistViews (outputs.hpp).
#include "outputs.hpp"

#include <ATen/ATen.h>

#include "kvmap/impl/kokkos_compat.hpp"
#include "stats_counters.hpp"

namespace kvmap::Detail {

namespace {

bool needs_materializing(const at::Tensor& t) {
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && t.size(d) > 1) return true;
  }
  return false;
}

}  // namespace

void adopt_unaliased(std::vector<at::Tensor>& outputs, const std::vector<MemorySpan>& tensor_spans,
                     const std::vector<ArrayArg>& arrays) {
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    at::Tensor& t = outputs[k];
    const MemorySpan span = span_of(t);
    bool shared = false;
    for (const MemorySpan& other : tensor_spans) shared = shared || span.overlaps(other);
    for (const ArrayArg& a : arrays)
      shared = shared || span.overlaps(span_of(a.block, size_of(a.dtype)));
    for (std::size_t j = 0; j < k; ++j) shared = shared || span.overlaps(span_of(outputs[j]));
    if (shared || needs_materializing(t)) {
      t = t.clone(at::MemoryFormat::Contiguous);
      count_bytes_copied(static_cast<std::uint64_t>(t.numel()) * t.element_size());
    }
  }
}

Layout output_layout(const Layout& lead, const OutputMeta& m) {
  Shape gshape;
  gshape.reserve(static_cast<std::size_t>(m.ndim) + 1);
  gshape.assign(m.shape, m.shape + m.ndim);
  gshape.insert(gshape.begin() + m.out_dim, lead.gshape()[*lead.split()]);
  return lead.with_shape(std::move(gshape), m.out_dim);
}

// After the agreement; cannot fail (zero-byte blocks on ranks without samples).
std::vector<OutputArray> assemble(std::vector<LocalBlock>& blocks,
                                  const std::vector<OutputMeta>& metas, const Layout& lead,
                                  bool ran, int me, Allocate allocate, const char* region) {
  ScopedRegion scope(region);
  std::vector<OutputArray> result;
  result.reserve(metas.size());
  for (std::size_t k = 0; k < metas.size(); ++k) {
    const DType dt = static_cast<DType>(metas[k].dtype);
    Layout layout = output_layout(lead, metas[k]);
    LocalBlock block = ran ? std::move(blocks[k]) : allocate(layout.lshape(me), size_of(dt));
    result.push_back(OutputArray{std::move(block), dt, std::move(layout)});
  }
  return result;
}

std::vector<MemorySpan> tensor_spans(const std::vector<at::Tensor>& tensors) {
  std::vector<MemorySpan> spans;
  spans.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    if (t.defined()) spans.push_back(span_of(t));
  }
  return spans;
}

}  // namespace kvmap::Detail
