// One array's halo exchange (halo_exchange.hpp).
#include "halo_exchange.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "stats_counters.hpp"
#include "tensor_blocks.hpp"
#include "torch_stream.hpp"

namespace kvmap::Detail {

namespace {

// Rows packed with the split axis first: [rows, the other extents...].
at::Tensor packed(const at::Tensor& like_first, std::int64_t rows) {
  std::vector<std::int64_t> shape(like_first.sizes().begin(), like_first.sizes().end());
  shape[0] = rows;
  return at::empty(shape, like_first.options().memory_format(at::MemoryFormat::Contiguous));
}

at::Tensor index_tensor(const std::vector<std::int64_t>& rows, const at::Tensor& like) {
  return at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(like.device());
}

}  // namespace

HaloExchange plan_halo_exchange(const at::Tensor& local, const Layout& layout, int rank,
                                HaloDepth depth, HaloBoundary boundary, double constant,
                                bool staged) {
  HaloExchange x;
  x.split = *layout.split();
  x.window = halo_window(layout, rank, depth, boundary);
  x.constant = constant;
  x.local = local;
  x.staged = staged;
  std::vector<std::int64_t> shape(local.sizes().begin(), local.sizes().end());
  shape[static_cast<std::size_t>(x.split)] = x.window.rows();
  x.extended = at::empty(shape, local.options().memory_format(at::MemoryFormat::Contiguous));
  const at::Tensor first = local.movedim(x.split, 0);
  // Bytes of one row (all extents but the split axis).
  std::uint64_t per_row = static_cast<std::uint64_t>(local.element_size());
  for (std::int64_t d = 1; d < first.dim(); ++d)
    per_row *= static_cast<std::uint64_t>(first.size(d));

  // Receives: this rank's window, grouped by source rank, in block order.
  std::vector<std::pair<int, std::vector<std::int64_t>>> from;  // peer -> block rows
  std::vector<std::int64_t> self_from, self_to;
  for (const HaloRun& run : x.window.runs) {
    if (run.source == HaloRun::kConstant) continue;
    for (std::int64_t k = 0; k < run.rows; ++k) {
      if (run.source == rank) {
        self_from.push_back(run.source_row + run.step * k);
        self_to.push_back(run.first_row + k);
        continue;
      }
      auto it = std::find_if(from.begin(), from.end(),
                             [&](const auto& p) { return p.first == run.source; });
      if (it == from.end()) it = from.insert(from.end(), {run.source, {}});
      it->second.push_back(run.first_row + k);
    }
  }
  std::sort(from.begin(), from.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::int64_t offset = 0;
  for (auto& [peer, rows] : from) {
    x.recvs.push_back(
        {peer, offset, static_cast<std::int64_t>(rows.size()), index_tensor(rows, local)});
    offset += static_cast<std::int64_t>(rows.size());
  }
  x.recv_rows = packed(first, offset);

  // Sends: the rows each receiver's window takes from this rank, in its block order (the
  // order its receive above expects).
  offset = 0;
  for (int peer : halo_receivers(layout, rank, depth, boundary)) {
    if (peer == rank) continue;
    std::vector<std::int64_t> rows;
    for (const HaloRun& run : halo_window(layout, peer, depth, boundary).runs) {
      if (run.source != rank) continue;
      for (std::int64_t k = 0; k < run.rows; ++k) rows.push_back(run.source_row + run.step * k);
    }
    x.sends.push_back(
        {peer, offset, static_cast<std::int64_t>(rows.size()), index_tensor(rows, local)});
    offset += static_cast<std::int64_t>(rows.size());
  }
  x.send_rows = packed(first, offset);
  if (!self_from.empty()) {
    x.self = {rank, 0, static_cast<std::int64_t>(self_from.size()), index_tensor(self_from, local)};
    x.self_to = index_tensor(self_to, local);
    x.self_rows = packed(first, x.self.rows);
  }
  if (staged) {
    x.send_host = at::empty(x.send_rows.sizes(), x.send_rows.options().device(at::kCPU));
    x.recv_host = at::empty(x.recv_rows.sizes(), x.recv_rows.options().device(at::kCPU));
  }
  // The messages, in bytes of the packed buffers.
  for (const auto& p : x.recvs)
    x.messages.recv(p.peer, static_cast<std::size_t>(p.offset) * per_row,
                    static_cast<std::size_t>(p.rows) * per_row);
  for (const auto& p : x.sends)
    x.messages.send(p.peer, static_cast<std::size_t>(p.offset) * per_row,
                    static_cast<std::size_t>(p.rows) * per_row);
  return x;
}

void run_halo_exchange(const Transport& transport, HaloExchange& x) {
  if (x.window.count == 0) return;  // a rank without rows holds and sends nothing
  const at::Tensor shard = x.local.movedim(x.split, 0);
  at::Tensor block = x.extended.movedim(x.split, 0);
  block.narrow(0, x.window.before, x.window.count).copy_(shard);
  count_bytes_copied(bytes_of(shard));
  for (const HaloExchange::Part& p : x.sends) {
    at::Tensor out = x.send_rows.narrow(0, p.offset, p.rows);
    at::index_select_out(out, shard, 0, p.index);
  }
  count_bytes_copied(bytes_of(x.send_rows));
  if (x.self.rows > 0) {
    at::index_select_out(x.self_rows, shard, 0, x.self.index);
    block.index_copy_(0, x.self_to, x.self_rows);
    count_bytes_copied(2 * bytes_of(x.self_rows));
  }
  for (const HaloRun& run : x.window.runs) {
    if (run.source == HaloRun::kConstant)
      block.narrow(0, run.first_row, run.rows).fill_(x.constant);
  }
  if (x.messages.size() > 0) {
    void* send_base = x.send_rows.data_ptr();
    void* recv_base = x.recv_rows.data_ptr();
    if (x.staged) {
      x.send_host.copy_(x.send_rows);
      count_bytes_copied(bytes_of(x.send_rows));
      send_base = x.send_host.data_ptr();
      recv_base = x.recv_host.data_ptr();
    }
    finish_torch_work(x.send_rows);
    transport.run(x.messages, send_base, recv_base);
    if (x.staged) {
      x.recv_rows.copy_(x.recv_host);
      count_bytes_copied(bytes_of(x.recv_rows));
    }
  }
  for (const HaloExchange::Part& p : x.recvs) {
    block.index_copy_(0, p.index, x.recv_rows.narrow(0, p.offset, p.rows));
  }
  count_bytes_copied(bytes_of(x.recv_rows));
}

}  // namespace kvmap::Detail
