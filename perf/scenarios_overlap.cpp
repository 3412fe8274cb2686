// map_overlap against the halo exchange a user writes by hand: a 1-D 5-point stencil and a 2-D
// 3x3 filter on a row-split grid (periodic along the split axis), each computed on the block
// extended by its neighbours' rows. Contenders, on the same data and the same torch operations:
// a hand-written exchange (MPI_Sendrecv of the edge rows with both neighbours into an extended
// block), kvmap::map_overlap, and the copy ceiling (building the extended block from the local
// rows alone, no exchange, then the same operations).
#include <ATen/ATen.h>
#include <Kokkos_Core.hpp>

#include <mpi.h>

#include "harness.hpp"
#include "kvmap/kvmap.hpp"

namespace kvmap_perf {

namespace {

using View = kvmap::DistView<>;

// The 1-D 5-point stencil on an extended block (2 rows each side): the block's own rows.
at::Tensor stencil_1d(const at::Tensor& e) {
  const std::int64_t m = e.size(0) - 4;
  return 0.4 * e.narrow(0, 2, m) + 0.2 * (e.narrow(0, 1, m) + e.narrow(0, 3, m)) +
         0.1 * (e.narrow(0, 0, m) + e.narrow(0, 4, m));
}

// A 3x3 filter on an extended row block (1 row each side), zero-padded across the columns.
at::Tensor filter_2d(const at::Tensor& e, const at::Tensor& w) {
  const std::int64_t stride[] = {1, 1}, padding[] = {0, 1};
  return at::conv2d(e.unsqueeze(0).unsqueeze(0), w, at::Tensor(), at::IntArrayRef(stride),
                    at::IntArrayRef(padding))
      .squeeze(0)
      .squeeze(0);
}

// The hand-written exchange: the extended block from the local rows and `depth` rows of each
// periodic neighbour, by MPI_Sendrecv (the rows are contiguous: the split axis is first).
at::Tensor exchange_by_hand(const at::Tensor& x, std::int64_t depth, MPI_Comm comm, int rank,
                            int size) {
  const std::int64_t n = x.size(0);
  at::Tensor e = at::empty({n + 2 * depth, x.size(1)}, x.options());
  e.narrow(0, depth, n).copy_(x);
  const int prev = (rank + size - 1) % size, next = (rank + 1) % size;
  const int count = static_cast<int>(depth * x.size(1));
  const MPI_Datatype type = x.scalar_type() == at::kFloat ? MPI_FLOAT : MPI_DOUBLE;
  // My first rows to the previous rank's tail; my last rows to the next rank's head.
  MPI_Sendrecv(x.data_ptr(), count, type, prev, 1, e.narrow(0, n + depth, depth).data_ptr(), count,
               type, next, 1, comm, MPI_STATUS_IGNORE);
  MPI_Sendrecv(x.narrow(0, n - depth, depth).data_ptr(), count, type, next, 2, e.data_ptr(), count,
               type, prev, 2, comm, MPI_STATUS_IGNORE);
  return e;
}

// The copy ceiling: the extended block with the local rows copied in and its halo rows left as
// they are (no exchange), the least any halo scheme copies.
at::Tensor copy_only(const at::Tensor& x, std::int64_t depth) {
  at::Tensor e = at::empty({x.size(0) + 2 * depth, x.size(1)}, x.options());
  e.narrow(0, depth, x.size(0)).copy_(x);
  return e;
}

void run_case(Report& report, const std::string& name, std::int64_t rows, std::int64_t cols,
              std::int64_t depth, bool two_d) {
  const kvmap::Comm& comm = report.comm();
  const int P = comm.size();
  View x = kvmap::random::normal({rows * P, cols}, kvmap::DType::Float32, 0);
  const at::Tensor local = x.local();
  const at::Tensor w = at::full({1, 1, 3, 3}, 1.0 / 9, local.options());
  auto op = [&](const at::Tensor& e) { return two_d ? filter_2d(e, w) : stencil_1d(e); };
  const auto options =
      kvmap::OverlapOptions().depth(depth).boundary(kvmap::Boundary::Periodic).trim(false);
  const auto mapped = kvmap::map_overlap([&](const at::Tensor& e) { return op(e); }, options);
  const MPI_Comm raw = comm.raw();
  at::Tensor by_hand, by_kvmap;
  auto hand = [&] { by_hand = op(exchange_by_hand(local, depth, raw, comm.rank(), P)); };
  auto kv = [&] { by_kvmap = mapped(x).local(); };
  auto ceiling = [&] { (void)op(copy_only(local, depth)); };
  hand();
  kv();
  require_same(at::equal(by_hand, by_kvmap), "overlap", "kvmap::map_overlap");
  const std::vector<Timing> t = measure_interleaved(comm, report.settings(), {hand, kv, ceiling});
  const double bytes = static_cast<double>(local.numel() * local.element_size());
  const char* names[] = {"hand-written MPI_Sendrecv", "kvmap::map_overlap", "copy ceiling"};
  for (int k = 0; k < 3; ++k) {
    Record r;
    r.scenario = "overlap";
    r.case_name = name;
    r.contender = names[k];
    r.time = t[static_cast<std::size_t>(k)];
    r.figures["elements_per_rank"] = static_cast<double>(local.numel());
    r.figures["gb_per_s"] = bytes / t[static_cast<std::size_t>(k)].median / 1e9;
    if (k == 1) r.figures["over_hand_written"] = t[0].median / t[1].median;  // throughput ratio
    report.add(std::move(r));
  }
}

}  // namespace

void scenario_overlap(Report& report) {
  const bool quick = report.settings().quick;
  run_case(report, "1-D 5-point stencil, 1M elements per rank", 1 << 20, 1, 2, false);
  run_case(report, "2-D 3x3 filter, 1M elements per rank", 1024, 1024, 1, true);
  if (!quick) {
    run_case(report, "1-D 5-point stencil, 64M elements per rank", 1 << 26, 1, 2, false);
    run_case(report, "2-D 3x3 filter, 64M elements per rank", 8192, 8192, 1, true);
  }
}

}  // namespace kvmap_perf
