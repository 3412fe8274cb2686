#include "out_dims.hpp"

#include "kvmap/error.hpp"
#include "kvmap/impl/local_block.hpp"
#include "kvmap/layout.hpp"

namespace kvmap::Detail {

bool out_dims_fit(const std::vector<std::int64_t>& dims, bool per_output, std::size_t nout) {
  return dims.size() == nout || (dims.size() == 1 && !per_output);
}

void check_out_dims_count(const std::vector<std::int64_t>& dims, bool per_output,
                          std::size_t nout) {
  KVMAP_CHECK(out_dims_fit(dims, per_output, nout), ValueError,
              "kvmap::vmap: out_dims " << to_string(dims) << " has " << dims.size()
                                       << " entries but the function returned " << nout
                                       << (per_output ? " outputs (give one per output)"
                                                      : " outputs (give one per output, or a "
                                                        "single one)"));
}

std::int64_t normalize_out_dim(const std::vector<std::int64_t>& dims, bool per_output,
                               std::size_t k, std::size_t nout, std::int64_t per_sample_ndim) {
  KVMAP_CHECK(!dims.empty(), ValueError, "kvmap::vmap: out_dims is empty");
  check_out_dims_count(dims, per_output, nout);
  KVMAP_CHECK(k < nout, ValueError, "kvmap::vmap: output " << k << " of " << nout);
  KVMAP_CHECK(per_sample_ndim >= 0 && per_sample_ndim < kMaxRank, ValueError,
              "kvmap::vmap: output " << k << " has " << per_sample_ndim
                                     << " dimensions per sample; 0 to " << kMaxRank - 1
                                     << " are supported");
  const std::int64_t d = dims.size() == 1 ? dims[0] : dims[k];
  const std::int64_t rank = per_sample_ndim + 1;
  KVMAP_CHECK(d >= -rank && d < rank, ValueError,
              "kvmap::vmap: out_dims[" << k << "] = " << d << " is out of range for output " << k
                                       << ", which has " << per_sample_ndim
                                       << " dimensions per sample (expected " << -rank
                                       << " <= out_dim < " << rank << ")");
  return d < 0 ? d + rank : d;
}

}  // namespace kvmap::Detail
