// Reliability: a fault injected on one rank at every collective entry point, property
// tests over random shapes/dtypes/layouts, soak, and overflow of sizes and counts.
#include "support/kvmap_test.hpp"

#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <random>

#include "comm_registry.hpp"
#include "hooks.hpp"
#include "local_block.hpp"
#include "support/entry_points.hpp"

#include <sys/resource.h>
#include <cmath>

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Layout;
using kvmap::Shape;

namespace {

// Virtual memory size of this process in bytes (Linux).
std::uint64_t vm_size_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}

// Resident set size of this process in MiB (Linux).
double rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// Every byte Kokkos allocates, in any memory space, seen through the Kokkos Tools
// allocation callbacks: kvmap's views, its block cache and anything else built on Kokkos.
class KokkosAllocations {
 public:
  KokkosAllocations() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_deallocate);
  }
  ~KokkosAllocations() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
  }
  KokkosAllocations(const KokkosAllocations&) = delete;
  KokkosAllocations& operator=(const KokkosAllocations&) = delete;
  // Bytes allocated since construction and not yet freed.
  static std::uint64_t live_bytes() {
    std::lock_guard<std::mutex> lock(mutex());
    std::uint64_t sum = 0;
    for (const auto& [ptr, size] : live()) sum += size;
    return sum;
  }
  static std::uint64_t allocations() { return count(); }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<const void*, std::uint64_t>& live() {
    static std::map<const void*, std::uint64_t> l;
    return l;
  }
  static std::uint64_t& count() {
    static std::uint64_t c = 0;
    return c;
  }
  static void on_allocate(Kokkos::Tools::SpaceHandle, const char*, const void* ptr,
                          std::uint64_t size) {
    std::lock_guard<std::mutex> lock(mutex());
    live()[ptr] = size;
    ++count();
  }
  static void on_deallocate(Kokkos::Tools::SpaceHandle, const char*, const void* ptr,
                            std::uint64_t) {
    std::lock_guard<std::mutex> lock(mutex());
    live().erase(ptr);
  }
};

}  // namespace

TEST_CASE(
    "a fault on one rank in the plan of every collective entry point is agreed, and the "
    "communicator survives") {
  const int odd = odd_rank();
  const at::Tensor xs = pattern({4 * nranks() + 2, 3}, at::kDouble, 1);
  auto x = View::from_global(xs, 0);
  auto y = View::from_global(pattern({4 * nranks() + 2, 3}, at::kDouble, 2), 0);
  const auto sites = entry_points(x, y, odd);
  CHECK(sites.size() == 19);
  const auto before = kvmap::Detail::faults_injected();
  for (const EntryPoint& site : sites) {
    INFO("site " << site.name);
    kvmap::Detail::arm_fault(site.name, odd, kvmap::Detail::FaultPhase::Plan);
    expect_collective_error<kvmap::Error>(site.call, {odd},
                                          std::string("injected fault at ") + site.name);
    kvmap::Detail::disarm_faults();
    // The same communicator carries on, and the arrays are unchanged (axpby wrote nothing).
    CHECK(bit_equal(x.allgather(), xs));
    CHECK(bit_equal(y.allgather(), pattern({4 * nranks() + 2, 3}, at::kDouble, 2)));
  }
  if (rank() == odd) CHECK(kvmap::Detail::faults_injected() - before == sites.size());
}

TEST_CASE("kvmap::agree: an application's step fails alike on every rank, or passes on all") {
  const kvmap::Comm world = kvmap::Comm::world();
  const auto before = kvmap::stats().collectives;
  CHECK_NOTHROW(kvmap::agree(world));  // nobody failed
  CHECK_NOTHROW(kvmap::agree(world, nullptr, "app step"));
  // One fixed-size agreement per call (none on one rank).
  CHECK(kvmap::stats().collectives - before == (nranks() > 1 ? 2u : 0u));
  const int odd = odd_rank();
  // The failing rank gets its own exception back (its type kept), every other rank a
  // RemoteError naming it with its message; the step's name is the caller's.
  expect_collective_error<kvmap::ValueError>(
      [&] {
        std::exception_ptr e;
        if (rank() == odd) e = std::make_exception_ptr(kvmap::ValueError("the input file is bad"));
        kvmap::agree(world, e, "app step");
      },
      {odd}, "the input file is bad");
  // Several failing ranks: the first one's message everywhere else.
  if (nranks() > 1) {
    expect_collective_error<kvmap::TypeError>(
        [&] {
          std::exception_ptr e;
          if (rank() >= 1) {
            e = std::make_exception_ptr(
                kvmap::TypeError("rank " + std::to_string(rank()) + " failed"));
          }
          kvmap::agree(world, e);
        },
        [] {
          std::vector<int> bad;
          for (int r = 1; r < nranks(); ++r) bad.push_back(r);
          return bad;
        }(),
        "failed");
  }
  // The communicator carries on.
  CHECK_NOTHROW(kvmap::agree(world));
}

TEST_CASE("an allocation that fails on one rank is agreed at every entry point that allocates") {
  // Every allocation is part of the plan: the failure is agreed like bad input, nothing
  // hangs, and the communicator survives. Entry points that allocate nothing on that rank
  // succeed and leave the fault armed.
  const int odd = odd_rank();
  const at::Tensor xs = pattern({4 * nranks() + 2, 3}, at::kDouble, 1);
  auto x = View::from_global(xs, 0);
  auto y = View::from_global(pattern({4 * nranks() + 2, 3}, at::kDouble, 2), 0);
  for (const EntryPoint& site : entry_points(x, y, odd)) {
    INFO("site " << site.name);
    const auto before = kvmap::Detail::faults_injected();
    if (rank() == odd) kvmap::Detail::arm_fault("allocate", -1);
    if (site.allocates) {
      expect_collective_error<kvmap::Error>(site.call, {odd}, "injected fault at allocate");
      if (rank() == odd) CHECK(kvmap::Detail::faults_injected() - before == 1);
    } else {
      CHECK_NOTHROW(site.call());
      CHECK(kvmap::Detail::faults_injected() == before);
    }
    kvmap::Detail::disarm_faults();
    CHECK(bit_equal(x.allgather(), xs));
  }
}

#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("gather to a rank short of memory: every rank throws, none waits in the exchange") {
  // The root's address space is capped below what the gathered array needs: Kokkos' real
  // allocation fails there, in the plan, and the failure is agreed.
  const int root = odd_rank();
  const int64_t n = int64_t(32) << 20;  // 256 MiB of float64 in all
  auto x = View::empty({n}, DType::Float64, 0);
  rlimit saved{};
  getrlimit(RLIMIT_AS, &saved);
  if (rank() == root) {
    rlimit capped = saved;
    capped.rlim_cur = static_cast<rlim_t>(vm_size_bytes() + (std::uint64_t(64) << 20));
    REQUIRE(setrlimit(RLIMIT_AS, &capped) == 0);
  }
  bool root_failed = false;
  try {
    x.gather(root);
  } catch (const kvmap::RemoteError& e) {
    CHECK(rank() != root);
    CHECK(e.failed_ranks() == std::vector<int>{root});
  } catch (const std::exception& e) {
    root_failed = true;
    CHECK(rank() == root);
    INFO("root: " << e.what());
  }
  if (rank() == root) {
    setrlimit(RLIMIT_AS, &saved);
    CHECK(root_failed);
  }
  // The communicator carries on.
  const auto sizes = kvmap::Detail::transport(world()).allgather(static_cast<int>(root_failed));
  CHECK(sizes[root] == 1);
  CHECK(kvmap::linalg::nrm2(View::full({10}, 2.0, DType::Float64, 0)) ==
        doctest::Approx(std::sqrt(40.0)));
}
#endif

TEST_CASE("property: random redistribution sequences preserve the array bit for bit") {
  std::mt19937_64 rng(20261202);  // the same stream on every rank
  const int P = nranks(), me = rank();
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto random_layout = [&](const Shape& g) -> Layout {
    const int ndim = static_cast<int>(g.size());
    const int64_t choice = pick(0, 3);
    if (ndim == 0 || choice == 0) return Layout::replicated(g, P);
    const int split = static_cast<int>(pick(0, ndim - 1));
    if (choice == 1) return Layout::balanced(g, split, P);
    std::vector<int64_t> counts(P, 0);  // random, often with empty ranks
    for (int64_t i = 0; i < g[split]; ++i) counts[pick(0, P - 1) * (pick(0, 3) ? 1 : 0)]++;
    return Layout::from_counts(g, split, counts);
  };
  int cases = 0;
  for (int iter = 0; iter < 60; ++iter) {
    const int ndim = static_cast<int>(pick(0, 4));
    Shape g;
    for (int d = 0; d < ndim; ++d) g.push_back(pick(0, 6));
    const DType dt = static_cast<DType>(pick(0, kvmap::kNumDTypes - 1));
    const at::Tensor full = pattern(g, kvmap::to_torch(dt), iter);
    auto v = View::from_global(full, std::nullopt);
    for (int step = 0; step < 4; ++step) {
      const Layout target = random_layout(g);
      INFO("iteration " << iter << " step " << step << " dtype " << kvmap::name(dt) << " target "
                        << target);
      v = v.redistribute(target);
      CHECK(v.layout() == target);
      const at::Tensor mine =
          target.split() ? full.narrow(*target.split(), target.offset(me), target.count(me)) : full;
      CHECK(bit_equal(v.local(), mine));
      ++cases;
    }
    CHECK(bit_equal(v.allgather(), full));
    // vmap of the identity returns its input exactly (when there is a batch to map).
    if (v.split() && g[*v.split()] > 0) {
      // The batch goes back to where it came from: out_dim = the split axis.
      auto same = kvmap::vmap([](const at::Tensor& t) { return t; },
                              kvmap::VmapOptions().out_dims({*v.split()}))(v);
      CHECK(bit_equal(same.allgather(), full));
      // ... in memory of its own: writing to it leaves the input as it was.
      same.local().zero_();
      CHECK(bit_equal(v.allgather(), full));
    }
  }
  CHECK(cases == 240);
}

TEST_CASE("soak: 10,000 vmap calls and 1,000 redistributions return to the baseline") {
  KokkosAllocations kokkos;  // from here on, every Kokkos allocation is tracked
  auto x = View::from_global(pattern({64 * nranks(), 16}, at::kFloat, 4), 0);
  auto f = [](const at::Tensor& v) { return v.exp(); };
  auto cycle = [&](int i) {
    auto y = kvmap::vmap(f, kvmap::VmapOptions().chunk_size(i % 2 ? 8 : 1000))(x);
    if (i % 10 == 0) {
      auto r = x.resplit(1).resplit(std::nullopt).resplit(0);
      CHECK_MESSAGE(r.layout() == x.layout(), "iteration " << i);
    }
  };
  for (int i = 0; i < 200; ++i) cycle(i);  // warm-up: caches and allocator pools fill
  const int64_t live = kvmap::stats().bytes_live;
  const std::uint64_t kokkos_live = KokkosAllocations::live_bytes();
  const std::uint64_t kokkos_allocs = KokkosAllocations::allocations();
  const double rss = rss_mib();
  for (int i = 0; i < 10000; ++i) cycle(i);
  CHECK(kvmap::stats().bytes_live == live);
  // All Kokkos memory, not only kvmap's own counter: back to the baseline exactly, although
  // the loop allocated (the resplits and chunked outputs go through Kokkos).
  CHECK(KokkosAllocations::live_bytes() == kokkos_live);
  CHECK(KokkosAllocations::allocations() > kokkos_allocs);
  MESSAGE("soak: Kokkos bytes live "
          << KokkosAllocations::live_bytes() << " (baseline " << kokkos_live << "), "
          << KokkosAllocations::allocations() - kokkos_allocs << " Kokkos allocations in the loop");
#if !defined(__SANITIZE_ADDRESS__)
  // ASan's quarantine holds freed memory, so the RSS bound applies to normal builds only.
  CHECK(rss_mib() - rss < 64.0);
#endif
  MESSAGE("soak: rss grew by " << rss_mib() - rss
                               << " MiB over 10,000 vmaps and 1,000 redistributions");
}

TEST_CASE("overflow: element counts, byte sizes and MPI counts never wrap around") {
  const int64_t big = std::numeric_limits<int64_t>::max() / 4;
  expect_collective_error<kvmap::ValueError>(
      [&] {
        View::empty({big, 8}, DType::Float32, 0);
      },
      all_ranks(), "more elements than int64 can count");
  // numel fits int64 but bytes do not fit size_t.
  expect_collective_error<kvmap::ValueError>(
      [&] { View::empty({big * 2}, DType::Complex128, std::nullopt); }, all_ranks(),
      "more bytes than size_t counts");
  // A view whose strides span more than int64 can address.
  CHECK_THROWS_WITH_AS(kvmap::Detail::checked_span_bytes({3, 3}, {2 * big, 2 * big}, 8),
                       doctest::Contains("spans more elements than int64"), kvmap::ValueError);
  // MPI counts above the (lowered) limit go through the large-count path, bit-exact.
  const std::size_t saved = kvmap::Detail::mpi_count_limit();
  kvmap::Detail::set_mpi_count_limit(5);
  const at::Tensor full = pattern({17, 9}, at::kComplexDouble, 5);
  auto v = View::from_global(full, 1);
  CHECK(bit_equal(v.resplit(0).allgather(), full));
  CHECK(bit_equal(kvmap::vmap([](const at::Tensor& t) { return t * 2; })(v.resplit(0)).allgather(),
                  full * 2));
  // Reductions of more values than the limit are reduced in pieces, exactly.
  std::vector<std::int64_t> values(17);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<std::int64_t>(i) * (rank() + 1);
  kvmap::Detail::transport(world()).allreduce_sum(values.data(), values.size(), DType::Int64);
  const std::int64_t ranks_sum = static_cast<std::int64_t>(nranks()) * (nranks() + 1) / 2;
  for (std::size_t i = 0; i < values.size(); ++i)
    CHECK(values[i] == static_cast<std::int64_t>(i) * ranks_sum);
  auto d = View::from_global(pattern({23}, at::kDouble, 6), 0);
  CHECK(kvmap::linalg::dot(d, d) ==
        doctest::Approx(pattern({23}, at::kDouble, 6).pow(2).sum().item<double>()));
  kvmap::Detail::set_mpi_count_limit(saved);
}
