#pragma once
// One array's halo rows exchanged into an extended block (map_overlap, DistView::halo): planned
// before the agreement (the window and the ranks from arithmetic/halo_plan, every buffer,
// index and message allocated), run after it (torch kernels on the shard's device and the
// transport's point-to-point messages only; nothing is allocated). Each rank sends each
// receiver the rows its window takes, packed in the receiver's block order, in one message per
// pair: the bytes that move are the halo rows, to the ranks that need them. Rows from its own
// shard (a periodic or reflecting edge) are copied, not sent. Device memory goes to MPI
// directly where MPI reads it, else through host copies of the packed rows.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "detail.hpp"
#include "halo_plan.hpp"
#include "kvmap/layout.hpp"
#include "mpi_transport.hpp"

namespace kvmap::Detail {

struct HaloExchange {
  // The rows of one peer, packed: `rows` rows at row `offset` of the packed buffer, each the
  // row `index[k]` of the shard (sends) or of the extended block (receives).
  struct Part {
    int peer = 0;
    std::int64_t offset = 0;
    std::int64_t rows = 0;
    at::Tensor index;  // int64, on the shard's device
  };
  int split = 0;
  HaloWindow window;
  double constant = 0.0;
  at::Tensor local;     // the shard (zero copy)
  at::Tensor extended;  // the extended block: contiguous, on the shard's device
  std::vector<Part> sends, recvs;
  Part self;  // rows of its own shard: `index` the shard's rows, `self_to` the block's
  at::Tensor self_to;
  at::Tensor send_rows, recv_rows, self_rows;  // packed, the split axis first, contiguous
  at::Tensor send_host, recv_host;             // host copies (staged only)
  bool staged = false;
  Messages messages;
};

// The plan of rank `rank` (check_halo first): allocations only, no communication.
HaloExchange plan_halo_exchange(const at::Tensor& local, const Layout& layout, int rank,
                                HaloDepth depth, HaloBoundary boundary, double constant,
                                bool staged);

// Fills the extended block: the shard's rows (one copy), its own halo rows, the constant's,
// then the other ranks' through the transport. After the agreement: kernels and MPI only.
void run_halo_exchange(const Transport& transport, HaloExchange& x);

}  // namespace kvmap::Detail
