// What each collective entry point sends and receives per call, counted by a PMPI layer
// (traffic/pmpi_counter.cpp) at every process count the test runs at. Each run writes its
// figures to traffic_np<P>.tsv; traffic/compare_traffic.py then checks that the entry points
// whose agreement needs no per-rank data cost the same at every P > 1 and make no MPI call
// at P = 1. Within a run: exchanges talk only to the ranks that hold data, and every result
// is checked against an independent reference (the gathered arrays, sample by sample).
#include "support/kvmap_test.hpp"

#include <fstream>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "gpu_aware_mpi.hpp"
#include "traffic/pmpi_counter.hpp"

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Layout;
using kvmap::Randomness;
using kvmap::VmapOptions;

namespace {

// What a row's cost may do as P grows (tests/traffic/compare_traffic.py checks it):
//   Fixed:      nothing at P = 1; the same calls, collectives and bytes at every P > 1;
//   Neighbours: the same collectives and bytes at every P > 1, and point-to-point messages
//               with a bounded set of neighbours (fewer at P = 2, where the rank before and
//               the rank after are one rank): calls at most those at the largest P;
//   Data:       reported, not checked (what really moves grows with P).
enum class Cost { Fixed, Neighbours, Data };
const char* name(Cost c) {
  return c == Cost::Fixed ? "fixed" : c == Cost::Neighbours ? "neighbours" : "data";
}

struct Row {
  std::string op;
  Cost cost;
  std::uint64_t calls, collectives, bytes_received;
  std::string functions;  // rank 0's calls
};

std::vector<Row>& rows() {
  static std::vector<Row> r;
  return r;
}

std::uint64_t max_over_ranks(std::uint64_t v) {
  std::uint64_t out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);  // not counted
  return out;
}

// One call of `op` after a warm-up call (communicator duplicates, cached plans and MPI
// operations are made once, not per call), counted.
kvmap_traffic::Counts measure(const std::string& name, Cost cost, const std::function<void()>& op) {
  op();
  MPI_Barrier(MPI_COMM_WORLD);
  const std::uint64_t counted_before = kvmap::stats().bytes_received;
  kvmap_traffic::start();
  op();
  kvmap_traffic::Counts c = kvmap_traffic::stop();
  // kvmap's own account of what it received agrees with MPI's arguments.
  CHECK(kvmap::stats().bytes_received - counted_before == c.bytes_received);
  rows().push_back(Row{name, cost, max_over_ranks(c.calls), max_over_ranks(c.collectives),
                       max_over_ranks(c.bytes_received), c.functions});
  INFO(name << " on rank " << rank() << ": " << c.functions);
  if (nranks() == 1 && cost == Cost::Fixed) CHECK(c.calls == 0);
  return c;
}

// Counts with every rank holding at least one sample, unbalanced: 1, 2, 3, 1, 2, 3, ...
std::vector<std::int64_t> uneven_counts(int P) {
  std::vector<std::int64_t> c(P);
  for (int r = 0; r < P; ++r) c[r] = r % 3 + 1;
  if (P > 1) c[0] = 4;  // not Heat's rule at any P
  return c;
}

std::set<int> overlapping(const std::vector<std::int64_t>& from, int me,
                          const std::vector<std::int64_t>& to, bool outgoing) {
  // Ranks q != me whose rows under `to` (outgoing) or `from` (incoming) meet me's rows.
  auto offsets = [](const std::vector<std::int64_t>& c) {
    std::vector<std::int64_t> o(c.size() + 1, 0);
    std::partial_sum(c.begin(), c.end(), o.begin() + 1);
    return o;
  };
  const auto of = offsets(from), ot = offsets(to);
  std::set<int> peers;
  for (int q = 0; q < static_cast<int>(from.size()); ++q) {
    if (q == me) continue;
    const std::int64_t lo = outgoing ? std::max(of[me], ot[q]) : std::max(of[q], ot[me]);
    const std::int64_t hi =
        outgoing ? std::min(of[me + 1], ot[q + 1]) : std::min(of[q + 1], ot[me + 1]);
    if (hi > lo) peers.insert(q);
  }
  return peers;
}

std::vector<std::int64_t> heat_counts(std::int64_t n, int P) {
  std::vector<std::int64_t> c(P);
  for (int r = 0; r < P; ++r) c[r] = n / P + (r < n % P ? 1 : 0);
  return c;
}

at::Tensor stacked_reference(const at::Tensor& xg, int nout) {
  std::vector<at::Tensor> per_sample;
  for (std::int64_t i = 0; i < xg.size(0); ++i) per_sample.push_back(xg[i] * 2 + (nout - 1));
  return at::stack(per_sample);
}

}  // namespace

TEST_CASE("vmap: one fixed-size agreement per call in every mode, for 1 and 9 outputs") {
  const int P = nranks();
  const std::int64_t n_even = 5 * P;
  const std::vector<std::int64_t> uneven = uneven_counts(P);
  const std::int64_t n_uneven = std::accumulate(uneven.begin(), uneven.end(), std::int64_t{0});
  auto even_x = View::from_global(pattern({n_even, 3}, at::kFloat, 1), 0);
  auto uneven_x = View::from_global(pattern({n_uneven, 3}, at::kFloat, 2), 0)
                      .redistribute(Layout::from_counts({n_uneven, 3}, 0, uneven));
  for (Randomness mode : {Randomness::Error, Randomness::Different, Randomness::Same}) {
    for (int nout : {1, 9}) {
      for (bool even : {true, false}) {
        const View& x = even ? even_x : uneven_x;
        std::vector<View> out;
        auto f = [nout](const at::Tensor& v) {
          std::vector<at::Tensor> r;
          for (int k = 0; k < nout; ++k) r.push_back(v * 2 + k);
          return r;
        };
        at::manual_seed(7);  // the same generator state on every rank (Same mode's usual case)
        const std::string name = std::string("vmap ") + kvmap::name(mode) + " " +
                                 std::to_string(nout) + (nout == 1 ? " output " : " outputs ") +
                                 (even ? "even" : "uneven");
        const auto c = measure(name, Cost::Fixed,
                               [&] { out = kvmap::vmap(f, VmapOptions().randomness(mode))(x); });
        // The agreement is one collective: an MPI_Allreduce of at most 128 bytes.
        if (P > 1) {
          CHECK(c.collectives == 1);
          CHECK(c.bytes_received <= 128);
          CHECK(c.all_to_all == 0);
        }
        REQUIRE(out.size() == static_cast<std::size_t>(nout));
        const at::Tensor xg = x.allgather();
        for (int k = 0; k < nout; ++k) {
          CHECK(out[k].layout() == x.layout());
          CHECK(at::equal(out[k].allgather(), stacked_reference(xg, k + 1)));
        }
      }
    }
  }
}

TEST_CASE("vmap: ranks without samples learn the outputs' metadata") {
  const int P = nranks();
  if (P == 1) return;
  // The last rank holds no sample: it allocates its empty outputs from the agreed metadata.
  std::vector<std::int64_t> counts(P, 2);
  counts[P - 1] = 0;
  const std::int64_t n = 2 * (P - 1);
  auto x = View::from_global(pattern({n, 3}, at::kFloat, 3), 0)
               .redistribute(Layout::from_counts({n, 3}, 0, counts));
  for (int nout : {1, 9}) {
    std::vector<View> out;
    const auto c =
        measure("vmap error " + std::to_string(nout) + " outputs, a rank without samples",
                Cost::Fixed, [&] {
                  out = kvmap::vmap([nout](const at::Tensor& v) {
                    std::vector<at::Tensor> r;
                    for (int k = 0; k < nout; ++k) r.push_back((v * 2 + k).to(at::kDouble));
                    return r;
                  })(x);
                });
    CHECK(c.all_to_all == 0);
    const at::Tensor xg = x.allgather();
    for (int k = 0; k < nout; ++k) {
      CHECK(out[k].lshape() == (rank() == P - 1 ? kvmap::Shape{0, 3} : kvmap::Shape{2, 3}));
      CHECK(out[k].dtype() == DType::Float64);
      CHECK(at::equal(out[k].allgather(), stacked_reference(xg, k + 1).to(at::kDouble)));
    }
  }
}

TEST_CASE("factories, from_global, linalg and manual_seed: one fixed-size agreement") {
  const int P = nranks();
  const kvmap::Shape shape{4 * P + 3, 5};
  std::optional<View> z;
  const auto c = measure("zeros", Cost::Fixed, [&] { z = View::zeros(shape, DType::Float64, 0); });
  if (P > 1) CHECK(c.collectives == 1);
  CHECK(z->allgather().eq(0).all().item<bool>());
  measure("full", Cost::Fixed, [&] { z = View::full(shape, 2.5, DType::Float64, 0); });
  CHECK(z->allgather().eq(2.5).all().item<bool>());
  measure("random::uniform", Cost::Fixed,
          [&] { z = kvmap::random::uniform<TestMemSpace>(shape, DType::Float64, 0); });
  const at::Tensor full = pattern(shape, at::kDouble, 4);
  std::optional<View> xo;
  measure("from_global", Cost::Fixed, [&] { xo = View::from_global(full, 0); });
  View& x = *xo;
  CHECK(at::equal(x.allgather(), full));
  View y = View::from_global(pattern(shape, at::kDouble, 5), 0);
  double dot = 0, nrm = 0;
  measure("linalg::dot", Cost::Fixed, [&] { dot = kvmap::linalg::dot(x, y); });
  measure("linalg::nrm2", Cost::Fixed, [&] { nrm = kvmap::linalg::nrm2(x); });
  measure("linalg::axpby", Cost::Fixed, [&] { kvmap::linalg::axpby(1.0, x, 0.0, y); });
  measure("manual_seed", Cost::Fixed, [&] { kvmap::manual_seed(11); });
  const at::Tensor yg = pattern(shape, at::kDouble, 5);
  // n-term sums in float64 in two orders: the bound of both, relative to the terms' magnitudes.
  const auto scalar = [](double v) { return at::full({}, v, at::kDouble); };
  const std::int64_t n = full.numel() + nranks();
  CHECK(kvmap::check_close(scalar(dot), scalar((full * yg).sum().item<double>()),
                           {n, scalar((full * yg).abs().sum().item<double>())}));
  CHECK(kvmap::check_close(scalar(nrm), scalar(full.norm().item<double>()),
                           {n + 3, scalar(full.norm().item<double>())}));
  // from_local needs every rank's count (data that really moves): reported, not fixed.
  measure("from_local", Cost::Data, [&] { View::from_local(x.local(), 0); });
  // With the layout known on every rank (balanced), nothing per rank travels.
  measure("from_local(layout)", Cost::Fixed, [&] { View::from_local(x.local(), x.layout()); });
}

TEST_CASE("halo and map_overlap: fixed-size agreements plus exactly the halo rows") {
  // Balanced rows of 5 float64, a periodic depth of 2: every rank receives 2 rows from each
  // neighbour (from the one other rank at P = 2), whatever P; nothing at P = 1 (its own rows).
  const int P = nranks();
  const kvmap::Shape shape{10 * P, 5};
  const at::Tensor full = pattern(shape, at::kDouble, 9);
  const View x = View::from_global(full, 0);
  const std::uint64_t halo_bytes = P > 1 ? 4 * 5 * sizeof(double) : 0;
  std::optional<View> z;
  const auto agreement = measure("zeros (the agreement alone)", Cost::Fixed,
                                 [&] { z = View::zeros(shape, DType::Float64, 0); });
  at::Tensor ext;
  const auto h = measure("halo depth 2, periodic", Cost::Neighbours,
                         [&] { ext = x.halo(2, kvmap::Boundary::Periodic); });
  CHECK(h.bytes_received == agreement.bytes_received + halo_bytes);
  if (P > 1) CHECK(h.collectives == 1);
  const std::int64_t me = rank();
  const at::Tensor idx = at::arange(me * 10 - 2, me * 10 + 12, at::kLong).remainder(10 * P);
  CHECK(at::equal(ext, full.index_select(0, idx)));
  // Copies: the 10 own rows once into the block, the 4 halo rows packed once and unpacked
  // once (at P = 1 its own rows, copied in the same two steps), whatever P.
  const std::uint64_t copied_before = kvmap::stats().bytes_copied;
  ext = x.halo(2, kvmap::Boundary::Periodic);
  CHECK(kvmap::stats().bytes_copied - copied_before == (10 + 4 + 4) * 5 * sizeof(double));
  std::optional<View> out;
  const auto vm = measure("vmap, one output (its agreement alone)", Cost::Fixed,
                          [&] { out = kvmap::vmap([](const at::Tensor& r) { return r * 2; })(x); });
  const auto mo = measure("map_overlap depth 2, periodic", Cost::Neighbours, [&] {
    out =
        kvmap::map_overlap([](const at::Tensor& b) { return b * 2; },
                           kvmap::OverlapOptions().depth(2).boundary(kvmap::Boundary::Periodic))(x);
  });
  CHECK(mo.bytes_received == agreement.bytes_received + vm.bytes_received + halo_bytes);
  if (P > 1) CHECK(mo.collectives == 2);
  CHECK(at::equal(out->allgather(), full * 2));
}

TEST_CASE("ghost exchange: one fixed-size agreement plus exactly the ghost rows, per call") {
  // A periodic chain: rank r owns ids [10 r, 10 r + 10) and ghosts the two ids before and the
  // two after (its own at P = 1).
  const int P = nranks(), me = rank();
  const std::int64_t n = 10 * P;
  std::vector<std::int64_t> owned, ghosts;
  for (std::int64_t k = 0; k < 10; ++k) owned.push_back(10 * me + k);
  for (std::int64_t k : {-2, -1, 10, 11}) ghosts.push_back(((10 * me + k) % n + n) % n);
  std::optional<kvmap::GhostExchange> gx;
  // The plan's three sparse rounds: probes and the directory's load vary with P (reported).
  measure("GhostExchange plan (three sparse rounds)", Cost::Data,
          [&] { gx.emplace(owned, ghosts, world()); });
  const at::Tensor full = pattern({n, 5}, at::kDouble, 12);
  const at::Tensor x = at::cat({full.narrow(0, 10 * me, 10), at::zeros({4, 5}, at::kDouble)});
  std::optional<View> z;
  const auto agreement = measure("zeros (the agreement alone, ghost case)", Cost::Fixed, [&] {
    z = View::zeros({n, 5}, DType::Float64, 0);
  });
  at::Tensor y, g;
  const auto f =
      measure("GhostExchange forward, 4 ghost rows", Cost::Neighbours, [&] { y = gx->forward(x); });
  const auto r =
      measure("GhostExchange reverse, 4 ghost rows", Cost::Neighbours, [&] { g = gx->reverse(x); });
  const std::uint64_t ghost_bytes = P > 1 ? 4 * 5 * sizeof(double) : 0;
  CHECK(f.bytes_received == agreement.bytes_received + ghost_bytes);
  CHECK(r.bytes_received == f.bytes_received);
  if (P > 1) CHECK(f.collectives == 1);
  CHECK(at::equal(y, at::cat({full.narrow(0, 10 * me, 10),
                              full.index_select(0, at::tensor(ghosts, at::kLong))})));
  // Copies per forward: the 10 own rows once, the 4 ghost rows packed once by their owner and
  // placed once from the received rows (at P = 1: placed once, straight from the own rows).
  const std::uint64_t copied_before = kvmap::stats().bytes_copied;
  y = gx->forward(x);
  const std::uint64_t row = 5 * sizeof(double);
  CHECK(kvmap::stats().bytes_copied - copied_before == (P > 1 ? (10 + 4 + 4) : (10 + 4)) * row);
}

TEST_CASE("start-up: the GPU-aware decision is one collective through kvmap::Comm") {
  // What kvmap's initialization runs once (platform/gpu_aware_mpi.hpp), again: counted by
  // stats() as by the PMPI layer, nothing at one rank.
  const std::uint64_t before = kvmap::stats().collectives;
  const auto c = measure("start-up GPU-aware decision", Cost::Fixed,
                         [] { kvmap::Detail::decide_gpu_aware_mpi_on_every_rank(); });
  // measure() runs it twice: a warm-up and the counted call.
  CHECK(kvmap::stats().collectives - before == 2 * c.collectives);
  if (nranks() > 1) {
    CHECK(c.collectives == 1);
    CHECK(c.bytes_received == sizeof(std::int32_t));
  }
}

TEST_CASE("balance, gather and scatter talk only to the ranks that hold data") {
  const int P = nranks(), me = rank();
  // Rows on the first half of the ranks only (and all on rank 0 when alone).
  std::vector<std::int64_t> counts(P, 0);
  const int holders = std::max(1, P / 2);
  for (int r = 0; r < holders; ++r) counts[r] = 3 + r;
  const std::int64_t n = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  const at::Tensor full = pattern({n, 4}, at::kFloat, 6);
  auto x = View::from_global(full, 0).redistribute(Layout::from_counts({n, 4}, 0, counts));
  std::optional<View> balanced;
  const auto b = measure("balance", Cost::Data, [&] { balanced = x.balance(); });
  CHECK(at::equal(balanced->allgather(), full));
  CHECK(balanced->layout() == Layout::balanced({n, 4}, 0, P));
  CHECK(b.all_to_all == 0);
  const std::vector<std::int64_t> target = heat_counts(n, P);
  CHECK(b.sent_to == overlapping(counts, me, target, true));
  CHECK(b.received_from == overlapping(counts, me, target, false));
  // The plan (pieces and datatypes) was made by the warm-up call.
  CHECK(b.types_committed == 0);

  at::Tensor g;
  const auto gc = measure("gather", Cost::Data, [&] { g = x.gather(0); });
  if (me == 0) CHECK(at::equal(g, full));
  CHECK(gc.all_to_all == 0);
  CHECK(gc.sent_to == (me != 0 && counts[me] > 0 ? std::set<int>{0} : std::set<int>{}));
  std::set<int> holders_but_root;
  for (int q = 1; q < P; ++q) {
    if (counts[q] > 0) holders_but_root.insert(q);
  }
  CHECK(gc.received_from == (me == 0 ? holders_but_root : std::set<int>{}));

  std::optional<View> s;
  const auto sc =
      measure("scatter", Cost::Data, [&] { s = View::scatter(me == 0 ? full : at::Tensor(), 0); });
  CHECK(at::equal(s->allgather(), full));
  CHECK(sc.all_to_all == 0);
  // Root sends each rank its rows; the others receive from root only.
  CHECK(sc.received_from == (me != 0 && target[me] > 0 ? std::set<int>{0} : std::set<int>{}));

  // Split along axis 1: pieces strided in the blocks, which MPI packs with datatypes built
  // once with the plan (the warm-up call's), not per call.
  auto cols = View::from_global(pattern({3, n}, at::kFloat, 8), 1)
                  .redistribute(Layout::from_counts({3, n}, 1, counts));
  std::optional<View> cols_balanced;
  const std::uint64_t plans_before = kvmap::stats().plans_built;
  const auto bc = measure("balance, split 1", Cost::Data, [&] { cols_balanced = cols.balance(); });
  // At most the warm-up call made a plan (at P = 1 an earlier call's plan fits); the next
  // call makes none.
  CHECK(kvmap::stats().plans_built - plans_before <= 1);
  const std::uint64_t plans_after = kvmap::stats().plans_built;
  cols_balanced = cols.balance();
  CHECK(kvmap::stats().plans_built == plans_after);
  CHECK(bc.types_committed == 0);
  CHECK(bc.all_to_all == 0);
  CHECK(bc.sent_to == overlapping(counts, me, target, true));
  CHECK(at::equal(cols_balanced->allgather(), cols.allgather()));

  // A change of split axis: every pair exchanges.
  auto wide = View::from_global(pattern({2 * P, 3 * P}, at::kFloat, 7), 0);
  std::optional<View> r;
  measure("resplit 0 -> 1", Cost::Data, [&] { r = wide.resplit(1); });
  CHECK(at::equal(r->allgather(), wide.allgather()));
}

TEST_CASE("write this run's figures") {
  if (rank() != 0) return;
  std::ofstream out("traffic_np" + std::to_string(nranks()) + ".tsv");
  for (const Row& r : rows()) {
    out << r.op << '\t' << name(r.cost) << '\t' << r.calls << '\t' << r.collectives << '\t'
        << r.bytes_received << '\t' << r.functions << '\n';
  }
  CHECK(out.good());
}
