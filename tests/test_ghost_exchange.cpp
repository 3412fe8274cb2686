// kvmap::GhostExchange at 1-4 ranks (every memory space of the build): forward against each
// ghost id's owner value, reverse against the sum over every rank's ghost rows of an id (every
// rank computes the whole scenario, so the references need no communication), the transpose
// identity across ranks, sub-communicators, host staging, and errors on every rank.
#include "support/kvmap_test.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/jit.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "ghost_plan.hpp"

using namespace kvmap_test;
using kvmap::GhostExchange;

namespace {

// A decomposition of `items` items over P ranks: item k has id 1000 + 3k (sparse ids) and is
// owned by rank (5k + 1) % P, except that rank 1 owns nothing when P > 2 (an empty rank). Each
// rank lists its owned ids in descending order and ghosts: every third item counted from its
// rank (any owner, itself included: periodic images), the first two of them again (repeats).
struct Scenario {
  std::vector<std::vector<std::int64_t>> owned, ghosts;  // per rank
  std::map<std::int64_t, int> owner;
};

Scenario scenario(int P, std::int64_t items) {
  Scenario s;
  s.owned.resize(static_cast<std::size_t>(P));
  s.ghosts.resize(static_cast<std::size_t>(P));
  for (std::int64_t k = 0; k < items; ++k) {
    int r = static_cast<int>((5 * k + 1) % P);
    if (P > 2 && r == 1) r = 2;
    s.owned[static_cast<std::size_t>(r)].push_back(1000 + 3 * k);
    s.owner[1000 + 3 * k] = r;
  }
  for (int r = 0; r < P; ++r) {
    auto& own = s.owned[static_cast<std::size_t>(r)];
    std::sort(own.rbegin(), own.rend());
    auto& g = s.ghosts[static_cast<std::size_t>(r)];
    for (std::int64_t k = r % 3; k < items; k += 3) g.push_back(1000 + 3 * k);
    if (g.size() >= 2) g.insert(g.end(), {g[1], g[0]});
  }
  return s;
}

// An integer-valued row value (exact in every dtype tested, and in the sums).
double value_of(std::int64_t id, std::int64_t c) {
  return static_cast<double>((id * 7 + c * 13) % 41 - 20);
}
double grad_of(int r, std::int64_t row, std::int64_t c) {
  return static_cast<double>((r * 31 + row * 11 + c * 5) % 17 - 8);
}

constexpr std::int64_t kWidth = 6;  // trailing shape {3, 2}

// Rank r's tensor: owned rows value_of(id), ghost rows -99 (forward overwrites them).
at::Tensor features(const Scenario& s, int r, at::ScalarType type) {
  const auto& own = s.owned[static_cast<std::size_t>(r)];
  const auto& g = s.ghosts[static_cast<std::size_t>(r)];
  at::Tensor x =
      at::full({static_cast<std::int64_t>(own.size() + g.size()), kWidth}, -99.0, at::kDouble);
  for (std::size_t i = 0; i < own.size(); ++i)
    for (std::int64_t c = 0; c < kWidth; ++c)
      x[static_cast<std::int64_t>(i)][c] = value_of(own[i], c);
  return x.reshape({x.size(0), 3, 2}).to(type);
}

at::Tensor expected_forward(const Scenario& s, int r) {
  const auto& own = s.owned[static_cast<std::size_t>(r)];
  const auto& g = s.ghosts[static_cast<std::size_t>(r)];
  at::Tensor x = features(s, r, at::kDouble).reshape({-1, kWidth});
  for (std::size_t j = 0; j < g.size(); ++j)
    for (std::int64_t c = 0; c < kWidth; ++c)
      x[static_cast<std::int64_t>(own.size() + j)][c] = value_of(g[j], c);
  return x.reshape({x.size(0), 3, 2});
}

at::Tensor gradients(const Scenario& s, int r) {
  const auto n = static_cast<std::int64_t>(s.owned[static_cast<std::size_t>(r)].size() +
                                           s.ghosts[static_cast<std::size_t>(r)].size());
  at::Tensor g = at::empty({n, kWidth}, at::kDouble);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < kWidth; ++c) g[i][c] = grad_of(r, i, c);
  return g.reshape({n, 3, 2});
}

// Owned rows: their own gradient plus every rank's ghost rows of their id; ghost rows zero.
at::Tensor expected_reverse(const Scenario& s, int r, int P) {
  const auto& own = s.owned[static_cast<std::size_t>(r)];
  at::Tensor out = gradients(s, r).reshape({-1, kWidth}).clone();
  std::map<std::int64_t, std::int64_t> row;
  for (std::size_t i = 0; i < own.size(); ++i) row[own[i]] = static_cast<std::int64_t>(i);
  for (int q = 0; q < P; ++q) {
    const auto& g = s.ghosts[static_cast<std::size_t>(q)];
    const auto nq = static_cast<std::int64_t>(s.owned[static_cast<std::size_t>(q)].size());
    for (std::size_t j = 0; j < g.size(); ++j) {
      const auto it = row.find(g[j]);
      if (it == row.end()) continue;
      for (std::int64_t c = 0; c < kWidth; ++c)
        out[it->second][c] += grad_of(q, nq + static_cast<std::int64_t>(j), c);
    }
  }
  out.narrow(0, static_cast<std::int64_t>(own.size()),
             out.size(0) - static_cast<std::int64_t>(own.size()))
      .zero_();
  return out.reshape({out.size(0), 3, 2});
}

GhostExchange plan_of(const Scenario& s, const kvmap::Comm& comm) {
  const auto r = static_cast<std::size_t>(comm.rank());
  return GhostExchange(s.owned[r], s.ghosts[r], comm);
}

}  // namespace

TEST_CASE("ghost exchange: forward fills ghosts from owners, reverse sums them back") {
  for_each_prefix_comm([](const kvmap::Comm& comm) {
    const int P = comm.size();
    const int me = comm.rank();
    const Scenario s = scenario(P, 11 * P + 4);
    const GhostExchange gx = plan_of(s, comm);
    CHECK(gx.owned() == static_cast<std::int64_t>(s.owned[me].size()));
    CHECK(gx.ghosts() == static_cast<std::int64_t>(s.ghosts[me].size()));
    // Received rows: one per distinct ghost id another rank owns.
    std::set<std::int64_t> remote;
    for (std::int64_t id : s.ghosts[me]) {
      if (s.owner.at(id) != me) remote.insert(id);
    }
    CHECK(gx.rows_received() == static_cast<std::int64_t>(remote.size()));
    for (at::ScalarType type : {at::kDouble, at::kFloat, at::kLong}) {
      INFO("P=" << P << " dtype " << type);
      const at::Tensor x = on_device(features(s, me, type));
      const at::Tensor y = gx.forward(x);
      CHECK(y.is_contiguous());
      CHECK(y.data_ptr() != x.data_ptr());
      CHECK(at::equal(y.cpu(), expected_forward(s, me).to(type)));
      const at::Tensor g = on_device(gradients(s, me).to(type));
      CHECK(at::equal(gx.reverse(g).cpu(), expected_reverse(s, me, P).to(type)));
      // In place: the same rows, in x's own storage.
      at::Tensor z = x.clone();
      const void* storage = z.data_ptr();
      CHECK(gx.forward_(z).data_ptr() == storage);
      CHECK(at::equal(z.cpu(), expected_forward(s, me).to(type)));
    }
    // The plain calls carry no autograd history (the operator is the differentiable form).
    const at::Tensor tracked = on_device(features(s, me, at::kDouble)).requires_grad_(true);
    CHECK_FALSE(gx.forward(tracked).requires_grad());
    CHECK_FALSE(gx.reverse(tracked).requires_grad());
    // Through host copies (what device memory takes without a GPU-aware MPI): the same.
    kvmap::Detail::set_force_host_staging(true);
    const at::Tensor x = on_device(features(s, me, at::kDouble));
    const at::Tensor y = gx.forward(x);
    const at::Tensor back = gx.reverse(on_device(gradients(s, me)));
    kvmap::Detail::set_force_host_staging(false);
    CHECK(at::equal(y.cpu(), expected_forward(s, me)));
    CHECK(at::equal(back.cpu(), expected_reverse(s, me, P)));
    // Every call above counted once, with its time, on the plan its copies share.
    const GhostExchange copy = gx;
    const GhostExchange::Usage u = copy.usage();
    CHECK(u.forward_calls == 8);
    CHECK(u.reverse_calls == 5);
    CHECK(u.forward_seconds > 0.0);
    CHECK(u.reverse_seconds > 0.0);
  });
}

TEST_CASE("ghost exchange: reverse is the transpose of forward across ranks") {
  const int P = nranks();
  const int me = rank();
  const Scenario s = scenario(P, 9 * P + 2);
  const GhostExchange gx = plan_of(s, world());
  const std::int64_t n = gx.owned() + gx.ghosts();
  at::Generator gen = at::detail::createCPUGenerator(1234 + static_cast<std::uint64_t>(me));
  const at::Tensor x = at::randn({n, 5}, gen, at::kDouble);
  const at::Tensor y = at::randn({n, 5}, gen, at::kDouble);
  const at::Tensor fx = gx.forward(on_device(x)).cpu();
  const at::Tensor fty = gx.reverse(on_device(y)).cpu();
  // <F x, y> and <x, F^T y>, each summed over ranks, with the sum of |terms| for the bound.
  double local[4] = {(fx * y).sum().item<double>(), (x * fty).sum().item<double>(),
                     (fx * y).abs().sum().item<double>(), (x * fty).abs().sum().item<double>()};
  double total[4];
  MPI_Allreduce(local, total, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  // Each side is a sum of at most N = (rows x 5 x P) products, plus the reverse's sums of at
  // most P + 1 terms per row: |error| <= (N + P + 1) eps sum|terms| on each side.
  const double N = static_cast<double>(n * 5 * P + P + 1);
  const double bound = N * std::numeric_limits<double>::epsilon() * (total[2] + total[3]);
  INFO("<Fx,y>=" << total[0] << " <x,F^T y>=" << total[1] << " bound " << bound);
  CHECK(std::abs(total[0] - total[1]) <= bound);
  CHECK(total[2] > 0.0);
}

TEST_CASE("ghost exchange: errors on every rank, nothing hangs") {
  const int P = nranks();
  const int me = rank();
  const int odd = odd_rank();
  const Scenario s = scenario(P, 5 * P + 1);
  // A ghost id nobody owns, on one rank.
  {
    std::vector<std::int64_t> ghosts = s.ghosts[me];
    if (me == odd) ghosts.push_back(7);
    expect_collective_error<kvmap::ValueError>(
        [&] { GhostExchange(s.owned[me], ghosts, world()); }, {odd},
        "ghost id 7 (ghost row " + std::to_string(s.ghosts[odd].size()) + ") is owned by no rank");
  }
  // An id listed twice by one rank.
  {
    std::vector<std::int64_t> owned = s.owned[me];
    if (me == odd) owned = {5, 6, 5};
    expect_collective_error<kvmap::ValueError>([&] { GhostExchange(owned, {}, world()); }, {odd},
                                               "owned id 5 is listed twice");
  }
  // An id two ranks own: the rank that keeps the id's directory entry reports it.
  if (P > 1) {
    std::vector<std::int64_t> owned = s.owned[me];
    if (me == 0 || me == P - 1) owned.push_back(424242);
    const int directory = kvmap::Detail::directory_of(424242, P);
    expect_collective_error<kvmap::ValueError>(
        [&] { GhostExchange(owned, {}, world()); }, {directory},
        "item id 424242 is owned by rank 0 and rank " + std::to_string(P - 1));
  }
  // Ids of the wrong type on one rank.
  {
    const at::Tensor good = at::tensor(s.owned[me], at::TensorOptions().dtype(at::kLong));
    const at::Tensor bad = me == odd ? good.to(at::kInt) : good;
    const at::Tensor ghosts = at::tensor(s.ghosts[me], at::TensorOptions().dtype(at::kLong));
    expect_collective_error<kvmap::TypeError>([&] { GhostExchange(bad, ghosts, world()); }, {odd},
                                              "owned_ids must be int64");
    // The tensor form of a good plan works.
    const GhostExchange gx(good, ghosts, world());
    CHECK(at::equal(gx.forward(on_device(features(s, me, at::kDouble))).cpu(),
                    expected_forward(s, me)));
  }
  const GhostExchange gx = plan_of(s, world());
  const at::Tensor x = on_device(features(s, me, at::kDouble));
  // A tensor of the wrong row count on one rank.
  expect_collective_error<kvmap::ValueError>(
      [&] { gx.forward(me == odd ? x.narrow(0, 0, x.size(0) - 1) : x); }, {odd},
      "owned + " + std::to_string(s.ghosts[odd].size()) + " ghost rows on this rank");
  if (P > 1) {
    // Another trailing shape on one rank: the agreed signature differs.
    expect_collective_error<kvmap::ValueError>(
        [&] {
          gx.forward(me == odd ? x.reshape({x.size(0), 2, 3}) : x);
        },
        {odd}, "needs the same arguments on every rank");
  }
  expect_collective_error<kvmap::TypeError>(
      [&] {
        gx.reverse(at::zeros({x.size(0), 2}, on_device(at::kBool)));
      },
      all_ranks(), "gradients of bool tensors have no sum");
  // In place on a tensor that is not contiguous, on one rank.
  {
    at::Tensor wide = on_device(at::zeros({x.size(0), 2 * x.size(1)}, at::kDouble));
    at::Tensor strided = me == odd ? wide.narrow(1, 0, x.size(1)) : x.clone();
    expect_collective_error<kvmap::ValueError>([&] { gx.forward_(strided); }, {odd},
                                               "must be contiguous");
  }
  // The plan carries on after the errors.
  CHECK(at::equal(gx.forward(x).cpu(), expected_forward(s, me)));
  // Handles: the plan's while it lives, an error after.
  std::int64_t h = 0;
  {
    const GhostExchange copy = plan_of(s, world());
    h = copy.handle();
    CHECK(h == copy.handle());
    CHECK(GhostExchange::from_handle(h).owned() == copy.owned());
  }
  CHECK_THROWS_WITH_AS(GhostExchange::from_handle(h), doctest::Contains("no GhostExchange plan"),
                       kvmap::Error);
}

namespace {

using ExchangeOp = c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, std::int64_t)>;
ExchangeOp ghost_op(bool reverse) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(reverse ? "kvmap::ghost_exchange_reverse" : "kvmap::ghost_exchange", "")
      .typed<at::Tensor(const at::Tensor&, std::int64_t)>();
}

// Every rank's [rows, 2] float64 block, concatenated in rank order on every rank.
at::Tensor allgather_rows(const at::Tensor& mine, const std::vector<std::int64_t>& rows) {
  std::vector<int> counts, displs;
  std::int64_t total = 0;
  for (std::int64_t r : rows) {
    counts.push_back(static_cast<int>(2 * r));
    displs.push_back(static_cast<int>(2 * total));
    total += r;
  }
  at::Tensor all = at::empty({total, 2}, at::kDouble);
  const at::Tensor m = mine.detach().cpu().contiguous();
  MPI_Allgatherv(m.data_ptr<double>(), static_cast<int>(m.numel()), MPI_DOUBLE,
                 all.data_ptr<double>(), counts.data(), displs.data(), MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

// TorchScript compiled in C++: `torch` is aten's builtins (as torch::jit::compile has it),
// `kvmap` the kvmap operators.
struct KvmapResolver : torch::jit::Resolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(const std::string& name,
                                                         torch::jit::GraphFunction&,
                                                         const torch::jit::SourceRange&) override {
    if (name == "torch") return std::make_shared<torch::jit::BuiltinModule>("aten");
    if (name == "kvmap") return std::make_shared<torch::jit::BuiltinModule>("kvmap");
    return nullptr;
  }
};

}  // namespace

TEST_CASE("ghost exchange operator: gradcheck of the global function in float64, both directions") {
  // The global function X -> Y (every rank's rows, concatenated) is what the op computes
  // together on all ranks; every rank holds the same X, applies the op to its rows and
  // gathers Y, so each finite difference and each backward is one collective call on every
  // rank. Its Jacobian by central differences against the one autograd gives, row by row.
  const int P = nranks();
  const int me = rank();
  const Scenario s = scenario(P, 3 * P + 2);
  const GhostExchange gx = plan_of(s, world());
  const std::int64_t plan = gx.handle();
  std::vector<std::int64_t> rows;
  for (int r = 0; r < P; ++r)
    rows.push_back(static_cast<std::int64_t>(s.owned[r].size() + s.ghosts[r].size()));
  std::int64_t offset = 0;
  for (int r = 0; r < me; ++r) offset += rows[r];
  at::Generator gen = at::detail::createCPUGenerator(99);  // the same X on every rank
  const at::Tensor X =
      at::randn({std::accumulate(rows.begin(), rows.end(), std::int64_t{0}), 2}, gen, at::kDouble);
  const std::int64_t n = X.numel();
  const double h = 1e-3;
  const double eps = std::numeric_limits<double>::epsilon();
  for (bool reverse : {false, true}) {
    INFO((reverse ? "ghost_exchange_reverse" : "ghost_exchange"));
    auto apply = [&](const at::Tensor& Xg) {
      return allgather_rows(ghost_op(reverse).call(on_device(Xg.narrow(0, offset, rows[me])), plan),
                            rows);
    };
    at::Tensor numeric = at::empty({n, n}, at::kDouble);  // [output, input]
    for (std::int64_t i = 0; i < n; ++i) {
      at::Tensor plus = X.clone(), minus = X.clone();
      plus.view(-1)[i] += h;
      minus.view(-1)[i] -= h;
      numeric.select(1, i).copy_((apply(plus) - apply(minus)).view(-1) / (2 * h));
    }
    at::Tensor analytic = at::empty({n, n}, at::kDouble);
    const at::Tensor x = on_device(X.narrow(0, offset, rows[me]).clone()).requires_grad_(true);
    const at::Tensor y = ghost_op(reverse).call(x, plan);
    for (std::int64_t j = 0; j < n; ++j) {
      at::Tensor seed = at::zeros({n}, at::kDouble);
      seed[j] = 1.0;
      const at::Tensor mine = on_device(seed.view({-1, 2}).narrow(0, offset, rows[me]).clone());
      const at::Tensor g = torch::autograd::grad({y}, {x}, {mine}, /*retain_graph=*/true)[0];
      analytic.select(0, j).copy_(allgather_rows(g, rows).view(-1));
    }
    // Y's entries are copies of X's (forward) or sums of at most 1 + all ghost rows of X's
    // (reverse): central differences are exact but for rounding, eps (terms) (max|X| + h) / h.
    std::int64_t terms = 1;
    for (int r = 0; r < P; ++r) terms += static_cast<std::int64_t>(s.ghosts[r].size());
    const double bound = 2.0 * eps * static_cast<double>(terms) *
                         (static_cast<double>(terms) * X.abs().max().item<double>() + h) / h;
    const double worst = (numeric - analytic).abs().max().item<double>();
    INFO("P=" << P << " largest |numeric - analytic| " << worst << " bound " << bound);
    CHECK(worst <= bound);
    // The analytic Jacobian is exact: 0/1 entries (forward), integer counts (reverse).
    CHECK(at::equal(analytic, analytic.round()));
    if (reverse) CHECK(analytic.abs().sum().item<double>() > 0.0);
  }
}

TEST_CASE("ghost exchange operator: double backward, TorchScript, Meta, no plan") {
  const int P = nranks();
  const int me = rank();
  const Scenario s = scenario(P, 6 * P + 1);
  const GhostExchange gx = plan_of(s, world());
  const std::int64_t plan = gx.handle();
  const std::int64_t n = gx.owned() + gx.ghosts();
  at::Generator gen = at::detail::createCPUGenerator(500 + static_cast<std::uint64_t>(me));
  const at::Tensor x0 = on_device(at::randn({n, 3}, gen, at::kDouble));
  const at::Tensor w = on_device(at::rand({n, 3}, gen, at::kDouble));
  const at::Tensor v = on_device(at::randn({n, 3}, gen, at::kDouble));
  const double eps = std::numeric_limits<double>::epsilon();
  std::int64_t terms = 1;
  for (int r = 0; r < P; ++r) terms += static_cast<std::int64_t>(s.ghosts[r].size());

  SUBCASE("forces from an energy, then their gradient (training on forces)") {
    // E = sum over ranks of 1/2 <y, w y>, y = F x: dE/dx = F^T (w F x); for L = <dE/dx, v>,
    // dL/dx = F^T (w F v): a second exchange in each direction.
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor y = ghost_op(false).call(x, plan);
    const at::Tensor energy = 0.5 * (y * w * y).sum();
    const at::Tensor force = torch::autograd::grad({energy}, {x}, {}, true, true)[0];
    const at::Tensor ref_force = gx.reverse(w * gx.forward(x0));
    const at::Tensor second = torch::autograd::grad({(force * v).sum()}, {x})[0];
    const at::Tensor ref_second = gx.reverse(w * gx.forward(v));
    // Sums of at most `terms` products, in any order: terms eps (the sum of |terms|).
    const at::Tensor scale1 = gx.reverse((w * gx.forward(x0)).abs());
    const at::Tensor scale2 = gx.reverse((w * gx.forward(v)).abs());
    CHECK(((force - ref_force).abs() <= static_cast<double>(terms) * eps * scale1)
              .all()
              .item<bool>());
    CHECK(((second - ref_second).abs() <= static_cast<double>(terms) * eps * scale2)
              .all()
              .item<bool>());
  }
  SUBCASE("a TorchScript function calling the op, its gradient") {
    // Compiled from source in C++, where a resolver names the operators' namespace (a model
    // scripted in Python calls torch.ops.kvmap.ghost_exchange: the Python tests).
    torch::jit::CompilationUnit cu;
    cu.define({}, R"JIT(
def layer(x, plan: int, w):
    return torch.tanh(kvmap.ghost_exchange(x, plan) * w)
)JIT",
              std::make_shared<KvmapResolver>(), nullptr);
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor out = cu.run_method("layer", x, plan, w).toTensor();
    const at::Tensor ref = at::tanh(gx.forward(x0) * w);
    // tanh of the same argument: a few ulp at most between its kernels.
    CHECK(((out - ref).abs() <= 4.0 * eps * ref.abs()).all().item<bool>());
    const at::Tensor grad = torch::autograd::grad({out.sum()}, {x})[0];
    const at::Tensor d = w * (1 - ref * ref);
    const at::Tensor ref_grad = gx.reverse(d);
    const at::Tensor scale = gx.reverse(d.abs());
    CHECK(((grad - ref_grad).abs() <= 8.0 * static_cast<double>(terms) * eps * scale)
              .all()
              .item<bool>());
  }
  SUBCASE("the Meta kernel gives the shape; a handle without a plan is an error") {
    const at::Tensor meta =
        at::empty({n, 4, 2}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
    for (bool reverse : {false, true}) {
      const at::Tensor shaped = ghost_op(reverse).call(meta, plan);
      CHECK(shaped.is_meta());
      CHECK(shaped.sizes() == meta.sizes());
    }
    // Every rank calls with the same bad handle: each fails before any communication.
    CHECK_THROWS_WITH_AS(ghost_op(false).call(x0, 987654321),
                         doctest::Contains("no GhostExchange plan has handle 987654321"),
                         kvmap::Error);
  }
}
