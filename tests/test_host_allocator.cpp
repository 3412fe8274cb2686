// kvmap's caching host allocator (kvmap/host_allocator.hpp) in torch's CPU slot: blocks reused
// and bounded, live tensors never sharing memory, many threads at once, torch's memory
// reporting kept, torch's allocator given back, and KVMAP_HOST_ALLOCATOR_MIB. Its own
// executable: the allocator is the process' for as long as it is installed.
#include "support/vmap_test.hpp"

#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include "host_allocator_start.hpp"
#include "kvmap/host_allocator.hpp"
#include "torch_compat.hpp"

using namespace kvmap_test;

namespace {

constexpr std::int64_t kMiB = std::int64_t(1) << 20;

// Installs kvmap's host allocator for the scope, then gives torch's back.
struct Installed {
  explicit Installed(std::size_t cache_bytes) {
    kvmap::HostAllocatorOptions o;
    o.cache_bytes = cache_bytes;
    kvmap::install_host_allocator(o);
  }
  ~Installed() { kvmap::uninstall_host_allocator(); }
  Installed(const Installed&) = delete;
  Installed& operator=(const Installed&) = delete;
};

at::Tensor bytes_tensor(std::int64_t bytes) {
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
}

}  // namespace

TEST_CASE("host allocator: a freed large block is reused by the next tensor of about its size") {
  c10::Allocator* torch_allocator = c10::GetCPUAllocator();
  {
    Installed installed(64 * kMiB);
    CHECK(kvmap::host_allocator_usage().installed);
    CHECK(c10::GetCPUAllocator() != torch_allocator);
    void* first = nullptr;
    {
      at::Tensor a = bytes_tensor(5 * kMiB);
      first = a.data_ptr();
      CHECK(reinterpret_cast<std::uintptr_t>(first) % 64 == 0);  // c10's alignment
      a.fill_(7);
      const kvmap::HostAllocatorUsage u = kvmap::host_allocator_usage();
      CHECK(u.fresh == 1);
      CHECK(u.reused == 0);
      CHECK(u.bytes_in_use == static_cast<std::size_t>(5 * kMiB));
      CHECK(u.bytes_kept == 0);
    }
    // 5 MiB + the header rounds to 6 MiB of whole huge pages.
    CHECK(kvmap::host_allocator_usage().bytes_kept == static_cast<std::size_t>(6 * kMiB));
    CHECK(kvmap::host_allocator_usage().bytes_in_use == 0);
    {
      // A little larger, the same whole pages: the same block.
      at::Tensor b = at::zeros({5 * kMiB / 4 + 1000}, at::kFloat);
      CHECK(b.data_ptr() == first);
      CHECK(b.sum().item<double>() == 0.0);  // zeros() wrote its values into the old block
      const kvmap::HostAllocatorUsage u = kvmap::host_allocator_usage();
      CHECK(u.reused == 1);
      CHECK(u.fresh == 1);
      CHECK(u.bytes_kept == 0);
      // Much larger than the kept block: a fresh one, the kept 6 MiB is left for later.
      at::Tensor c = bytes_tensor(40 * kMiB);
      CHECK(kvmap::host_allocator_usage().fresh == 2);
    }
    // Small allocations go to c10's allocation, not to the cache.
    const std::size_t kept = kvmap::host_allocator_usage().bytes_kept;
    const std::uint64_t small = kvmap::host_allocator_usage().small;
    { at::Tensor s = at::ones({1000}, at::kDouble); }
    CHECK(kvmap::host_allocator_usage().small == small + 1);
    CHECK(kvmap::host_allocator_usage().bytes_kept == kept);
    // A zero-byte tensor has no memory.
    at::Tensor empty = at::empty({0}, at::kFloat);
    CHECK(empty.numel() == 0);
  }
  CHECK_FALSE(kvmap::host_allocator_usage().installed);
  CHECK(c10::GetCPUAllocator() == torch_allocator);
}

TEST_CASE("host allocator: at most cache_bytes are kept, the largest kept blocks go first") {
  Installed installed(14 * kMiB);
  std::vector<at::Tensor> live;
  for (const std::int64_t mib : {5, 5, 9}) live.push_back(bytes_tensor(mib * kMiB));
  // Capacities 6, 6 and 10 MiB (whole huge pages with the header), freed in this order: 6 kept,
  // 6 + 6 kept, then 12 + 10 > 14: the largest kept blocks go until the new one fits.
  live[0] = at::Tensor();
  live[1] = at::Tensor();
  CHECK(kvmap::host_allocator_usage().bytes_kept == static_cast<std::size_t>(12 * kMiB));
  live[2] = at::Tensor();
  kvmap::HostAllocatorUsage u = kvmap::host_allocator_usage();
  CHECK(u.bytes_kept == static_cast<std::size_t>(10 * kMiB));
  CHECK(u.returned == 2);
  CHECK(u.bytes_kept_peak == static_cast<std::size_t>(12 * kMiB));
  // A block larger than the whole cache is never kept.
  { at::Tensor huge = bytes_tensor(20 * kMiB); }
  u = kvmap::host_allocator_usage();
  CHECK(u.returned == 3);
  CHECK(u.bytes_kept == static_cast<std::size_t>(10 * kMiB));
}

TEST_CASE("host allocator: live tensors never share memory, reused blocks included") {
  Installed installed(256 * kMiB);
  // Rounds of tensors of varying sizes around the cached minimum, each filled with its own
  // value, half of them freed every round: every live tensor must still hold its value.
  std::vector<std::pair<at::Tensor, double>> live;
  std::uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int value = 0;
  for (int round = 0; round < 20; ++round) {
    for (int k = 0; k < 6; ++k) {
      const std::int64_t elements = (1 + static_cast<std::int64_t>(next() % 12)) * kMiB / 8 +
                                    static_cast<std::int64_t>(next() % 4096);
      at::Tensor t = at::empty({elements}, at::kDouble);
      t.fill_(static_cast<double>(++value));
      live.emplace_back(t, static_cast<double>(value));
    }
    std::set<const void*> starts;
    for (const auto& [t, v] : live) {
      CHECK(t.min().item<double>() == v);
      CHECK(t.max().item<double>() == v);
      starts.insert(t.data_ptr());
    }
    CHECK(starts.size() == live.size());
    std::vector<std::pair<at::Tensor, double>> kept;
    for (std::size_t i = 0; i < live.size(); ++i)
      if (next() % 2 == 0) kept.push_back(live[i]);
    live = std::move(kept);
  }
  const kvmap::HostAllocatorUsage u = kvmap::host_allocator_usage();
  CAPTURE(u.reused);
  CAPTURE(u.fresh);
  CHECK(u.reused > 0);
}

TEST_CASE("host allocator: many threads allocating and freeing at once") {
  Installed installed(128 * kMiB);
  constexpr int kThreads = 4, kRounds = 100;
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &wrong] {
      for (int r = 0; r < kRounds; ++r) {
        const std::int64_t n = (4 + (t + r) % 9) * kMiB / 4;
        at::Tensor a = at::full({n}, static_cast<float>(t * 1000 + r), at::kFloat);
        at::Tensor small = at::full({64}, static_cast<float>(r), at::kFloat);
        if (a[n - 1].item<float>() != static_cast<float>(t * 1000 + r)) ++wrong[t];
        if (small[0].item<float>() != static_cast<float>(r)) ++wrong[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(wrong[t] == 0);
  const kvmap::HostAllocatorUsage u = kvmap::host_allocator_usage();
  CHECK(u.reused + u.fresh >= static_cast<std::uint64_t>(kThreads * kRounds));
  CHECK(u.reused > 0);
  CHECK(u.bytes_in_use == 0);
}

TEST_CASE("host allocator: torch's memory reporting sees every allocation") {
  Installed installed(64 * kMiB);
  std::int64_t reported = 0, peak = 0;
  {
    kvmap::Detail::torch_compat::MemoryReporting reporting([&](std::int64_t delta) {
      reported += delta;
      if (reported > peak) peak = reported;
    });
    at::Tensor a = bytes_tensor(6 * kMiB);
    at::Tensor b = at::empty({100}, at::kDouble);
    CHECK(reported == 6 * kMiB + 800);
  }
  CHECK(reported == 0);
  CHECK(peak == 6 * kMiB + 800);

  // kvmap's chunk_size(auto) probe measures f's temporaries through that reporting: the same
  // bytes per sample with kvmap's host allocator as with torch's.
  const at::Tensor full = randn_everywhere({64 * nranks(), 32}, at::kFloat, 5);
  auto x = View::from_global(full, 0);
  auto f = [](const at::Tensor& xs) {
    const at::Tensor wide = xs.unsqueeze(-1).expand({xs.size(0), 32, 2048}).contiguous();
    return (wide * 2.0).sum({1, 2});
  };
  const auto options = kvmap::VmapOptions().chunk_size(kvmap::auto_chunk).memory_budget(16 * kMiB);
  kvmap::reset_stats();
  const auto y_cached = kvmap::map_batches(f, options)(x);
  const std::int64_t cached = kvmap::stats().auto_bytes_per_sample;
  kvmap::uninstall_host_allocator();
  kvmap::reset_stats();
  const auto y_torch = kvmap::map_batches(f, options)(x);
  const std::int64_t torch_own = kvmap::stats().auto_bytes_per_sample;
  CHECK(cached >= 2 * 32 * 2048 * 4);
  CHECK(cached == torch_own);
  CHECK(at::equal(y_cached.allgather(), y_torch.allgather()));
}

TEST_CASE("host allocator: given back, its live tensors stay valid and are returned when freed") {
  c10::Allocator* torch_allocator = c10::GetCPUAllocator();
  at::Tensor survivor;
  {
    Installed installed(64 * kMiB);
    survivor = at::full({2 * kMiB}, 3.0, at::kDouble);  // 16 MiB, kvmap's block
    // raw_allocate/raw_deallocate (the interface Thrust-style users take) work too.
    void* raw = c10::GetCPUAllocator()->raw_allocate(8 * kMiB);
    REQUIRE(raw != nullptr);
    static_cast<char*>(raw)[8 * kMiB - 1] = 1;
    c10::GetCPUAllocator()->raw_deallocate(raw);
    CHECK(kvmap::host_allocator_usage().bytes_kept > 0);
  }
  CHECK(c10::GetCPUAllocator() == torch_allocator);
  const kvmap::HostAllocatorUsage before = kvmap::host_allocator_usage();
  CHECK(before.bytes_kept == 0);  // the kept blocks went when it was given back
  CHECK(survivor.sum().item<double>() == 3.0 * 2 * kMiB);
  survivor = at::Tensor();
  const kvmap::HostAllocatorUsage after = kvmap::host_allocator_usage();
  CHECK(after.returned == before.returned + 1);
  CHECK(after.bytes_kept == 0);
  // Tensors made now are torch's: kvmap's counters do not move.
  { at::Tensor t = bytes_tensor(10 * kMiB); }
  CHECK(kvmap::host_allocator_usage().fresh == after.fresh);
  kvmap::uninstall_host_allocator();  // not installed: nothing
  CHECK(c10::GetCPUAllocator() == torch_allocator);
}

TEST_CASE("host allocator: KVMAP_HOST_ALLOCATOR_MIB must be a whole number of MiB") {
  for (const char* bad : {"12x", "-1", "1.5", " 8", "99999999999999999999999"}) {
    CAPTURE(bad);
    setenv("KVMAP_HOST_ALLOCATOR_MIB", bad, 1);
    CHECK_THROWS_WITH_AS(kvmap::Detail::apply_host_allocator_environment(),
                         doctest::Contains("is not a whole number of MiB"), kvmap::ValueError);
  }
  setenv("KVMAP_HOST_ALLOCATOR_MIB", "0", 1);
  kvmap::Detail::apply_host_allocator_environment();
  CHECK_FALSE(kvmap::host_allocator_usage().installed);
  unsetenv("KVMAP_HOST_ALLOCATOR_MIB");
}

// Run alone, with KVMAP_HOST_ALLOCATOR_MIB=48 in the environment (tests/CMakeLists.txt).
TEST_CASE("host allocator: installed from KVMAP_HOST_ALLOCATOR_MIB when the library loads" *
          doctest::skip(std::getenv("KVMAP_HOST_ALLOCATOR_MIB") == nullptr)) {
  REQUIRE(std::string(std::getenv("KVMAP_HOST_ALLOCATOR_MIB")) == "48");
  CHECK(kvmap::host_allocator_usage().installed);
  // The limit is the variable's: a 40 MiB block is kept, a 50 MiB one is not.
  { at::Tensor a = bytes_tensor(40 * kMiB); }
  CHECK(kvmap::host_allocator_usage().bytes_kept == static_cast<std::size_t>(40 * kMiB + 2 * kMiB));
  { at::Tensor b = bytes_tensor(50 * kMiB); }
  CHECK(kvmap::host_allocator_usage().returned == 1);
  kvmap::uninstall_host_allocator();
}
