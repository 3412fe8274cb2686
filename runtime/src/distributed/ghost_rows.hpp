#pragma once
// Host loops that move a ghost exchange's rows (kvmap::GhostExchange on CPU tensors): each row
// copied or added once, straight from where it is to where it goes, with no index tensors and
// no intermediate buffers (ATen's index_select / index_copy_ / index_add_ take several passes
// and a temporary per step). Device tensors take the ATen path in ghost_exchange.cpp.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ghost_plan.hpp"

namespace kvmap::Detail {

// Bytes of one row of x (its element size times its trailing dimensions; rows or none).
std::int64_t ghost_row_bytes(const at::Tensor& x);

// Whether the host loops apply: a contiguous CPU tensor (reverse: of float32 or float64, the
// types it sums natively; the others take ATen's sums).
bool host_rows_apply(const at::Tensor& x, bool reverse);

// forward: out's owned rows are in's (out may be in: in place); sent packs the owned rows each peer
// receives (in peer order); the ghost rows whose owner is this rank take their owned row.
void host_forward_local(const GhostRoutes& r, std::int64_t owned, const at::Tensor& in,
                        at::Tensor& out, at::Tensor& sent);
// forward, after the messages: each remotely owned ghost row from its received row.
void host_forward_remote(const GhostRoutes& r, std::int64_t owned, const at::Tensor& received,
                         at::Tensor& out);
// reverse: out's owned rows are in's, its ghost rows zero; received[pos] sums the ghost rows
// of in that the owner at pos receives (what goes back to the owners).
void host_reverse_local(const GhostRoutes& r, std::int64_t owned, const at::Tensor& in,
                        at::Tensor& out, at::Tensor& received);
// reverse, after the messages: each sent row's returned sum, then each ghost row this rank
// owns, added into its owned row (in the order of the routes).
void host_reverse_remote(const GhostRoutes& r, std::int64_t owned, const at::Tensor& in,
                         const at::Tensor& sent, at::Tensor& out);

}  // namespace kvmap::Detail
