#pragma once
// Validation of vmap's out_dims: pure, no torch (fuzzed).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "detail.hpp"

namespace kvmap::Detail {

// Whether `dims` fits nout outputs: one entry per output, or (unless `per_output`) a single
// entry for all. check_out_dims_count: ValueError naming both counts when it does not.
bool out_dims_fit(const std::vector<std::int64_t>& dims, bool per_output, std::size_t nout);
void check_out_dims_count(const std::vector<std::int64_t>& dims, bool per_output, std::size_t nout);

// The out_dim of output k of nout, normalized to [0, per_sample_ndim]. `dims` holds one
// entry per output, or (unless `per_output`) a single entry for all. ValueError names the
// problem.
std::int64_t normalize_out_dim(const std::vector<std::int64_t>& dims, bool per_output,
                               std::size_t k, std::size_t nout, std::int64_t per_sample_ndim);

}  // namespace kvmap::Detail
