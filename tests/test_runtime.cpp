// The run-time choices kvmap makes when it starts: the GPU each rank takes (detail/device_map)
// and whether MPI is given device memory (detail/gpu_aware_mpi), against independent
// references: counting by hand, the MPI's own name and processor names, and bytes_copied of
// the staged and direct paths forced by the test hooks.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "support/kvmap_test.hpp"
#include "device_map.hpp"
#include "gpu_aware_mpi.hpp"
#include "hooks.hpp"

namespace {

using kvmap::Detail::GpuAwareMode;
using kvmap::Detail::MpiGpuQuery;

int world_rank() {
  return kvmap_test::rank();
}
int world_size() {
  return kvmap_test::nranks();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A fake environment for user_chose_device.
std::map<std::string, std::string>* g_env = nullptr;
const char* fake_getenv(const char* name) {
  const auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.c_str();
}
bool chose(std::vector<const char*> args, std::map<std::string, std::string> env = {}) {
  g_env = &env;
  args.insert(args.begin(), "app");
  return kvmap::Detail::user_chose_device(static_cast<int>(args.size()), args.data(), fake_getenv);
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

// Restores the environment and the decision the test changed.
struct RestoreDecision {
  std::string saved;
  bool had = false;
  RestoreDecision() {
    if (const char* v = std::getenv("KVMAP_GPU_AWARE_MPI")) {
      had = true;
      saved = v;
    }
  }
  ~RestoreDecision() {
    if (had) {
      setenv("KVMAP_GPU_AWARE_MPI", saved.c_str(), 1);
    } else {
      unsetenv("KVMAP_GPU_AWARE_MPI");
    }
    kvmap::Detail::set_host_follows_gpu_decision(false);
    kvmap::Detail::set_force_host_staging(false);
    kvmap::Detail::redecide_gpu_aware_mpi();
  }
};

}  // namespace

TEST_CASE("device map: each rank of a node takes node-local rank mod devices, balanced") {
  for (int devices = 1; devices <= 8; ++devices) {
    for (int ranks = 1; ranks <= 20; ++ranks) {
      CAPTURE(devices);
      CAPTURE(ranks);
      std::vector<int> load(static_cast<std::size_t>(devices), 0);
      for (int r = 0; r < ranks; ++r) {
        const int d = kvmap::Detail::device_for_rank(r, devices);
        REQUIRE(d >= 0);
        REQUIRE(d < devices);
        ++load[static_cast<std::size_t>(d)];
        // Consecutive ranks (a launcher's packed placement) on different devices.
        if (r > 0 && devices > 1) CHECK(d != kvmap::Detail::device_for_rank(r - 1, devices));
      }
      // As even as it can be: every device has ranks/devices ranks, rounded down or up.
      for (int n : load) {
        CHECK(n >= ranks / devices);
        CHECK(n <= (ranks + devices - 1) / devices);
      }
    }
  }
  // The cases users meet: 4 ranks on a 4-GPU node, 8 ranks on 4 GPUs, 6 on 4, 4 on 1.
  CHECK(kvmap::Detail::device_for_rank(3, 4) == 3);
  CHECK(kvmap::Detail::device_for_rank(5, 4) == 1);
  CHECK(kvmap::Detail::device_for_rank(7, 4) == 3);
  CHECK(kvmap::Detail::device_for_rank(3, 1) == 0);
  CHECK_THROWS_AS(kvmap::Detail::device_for_rank(0, 0), kvmap::Error);
  CHECK_THROWS_AS(kvmap::Detail::device_for_rank(-1, 2), kvmap::Error);
}

TEST_CASE("device map: the user's choice (Kokkos flags or environment) wins") {
  CHECK_FALSE(chose({}));
  CHECK_FALSE(chose({"--kokkos-num-threads=2", "--test-case=x", "--kokkos-disable-warnings"}));
  CHECK(chose({"--kokkos-device-id=1"}));
  CHECK(chose({"--kokkos-map-device-id-by=mpi_rank"}));
  CHECK(chose({"--kokkos-num-devices=4"}));
  CHECK(chose({"--kokkos-device=2"}));  // Kokkos 3.4's spelling
  CHECK(chose({"--device-id=0"}));
  CHECK(chose({"-x", "--kokkos-ndevices=2,1"}));
  CHECK_FALSE(chose({"--kokkos-device-identity=1"}));  // not a Kokkos flag
  CHECK_FALSE(chose({"--devices=3"}));
  CHECK(chose({}, {{"KOKKOS_DEVICE_ID", "3"}}));
  CHECK(chose({}, {{"KOKKOS_MAP_DEVICE_ID_BY", "random"}}));
  CHECK(chose({}, {{"KOKKOS_NUM_DEVICES", "4"}}));
  CHECK(chose({}, {{"KOKKOS_VISIBLE_DEVICES", "1,2"}}));
  CHECK_FALSE(chose({}, {{"KOKKOS_DEVICE_ID", ""}}));  // set but empty: not a choice
  CHECK_FALSE(chose({}, {{"CUDA_VISIBLE_DEVICES", "0,1"}, {"KOKKOS_NUM_THREADS", "2"}}));
  // argv[0] is the program, never a flag.
  const char* only_program[] = {"--kokkos-device-id=1"};
  std::map<std::string, std::string> none;
  g_env = &none;
  CHECK_FALSE(kvmap::Detail::user_chose_device(1, only_program, fake_getenv));
}

TEST_CASE("device map: node-local rank and size agree with the processor names") {
  // Reference: ranks that report the same processor name share a node, numbered by world rank.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  const int P = world_size();
  std::vector<char> names(static_cast<std::size_t>(P) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  const auto name_of = [&](int r) {
    return std::string(names.data() + static_cast<std::ptrdiff_t>(r) * MPI_MAX_PROCESSOR_NAME);
  };
  int expected_rank = 0, expected_size = 0;
  for (int r = 0; r < P; ++r) {
    if (name_of(r) != name_of(world_rank())) continue;
    ++expected_size;
    if (r < world_rank()) ++expected_rank;
  }
  const kvmap::Detail::NodeRank node = kvmap::Detail::node_local_rank(kvmap::Comm::world());
  CHECK(node.rank == expected_rank);
  CHECK(node.size == expected_size);
}

TEST_CASE("device map: build_info reports the device this rank uses") {
  const std::string info = kvmap::build_info();
  if constexpr (kvmap::Impl::is_host_accessible<TestMemSpace>) {
    // A host build, or host memory in a GPU build: the report names a device either way.
    CHECK(contains(info, "; device "));
  } else {
    const kvmap::Impl::DeviceSpec d = kvmap::Impl::device_of<TestMemSpace>();
    CHECK(contains(info, ":" + std::to_string(d.index) + " ("));
    CHECK(contains(info, "node-local rank"));
  }
  CHECK(contains(info, "GPU-aware MPI "));
}

TEST_CASE("GPU-aware MPI: the decision from environment, build and the MPI's answer") {
  using A = MpiGpuQuery::Answer;
  const MpiGpuQuery yes{A::Yes, "X: query() = 1"}, no{A::No, "X: query() = 0"},
      unknown{A::Unknown, "X offers no query"};
  for (GpuAwareMode mode : {GpuAwareMode::Off, GpuAwareMode::On, GpuAwareMode::Auto}) {
    for (const MpiGpuQuery& q : {yes, no, unknown}) {
      // The environment overrides the build and the MPI.
      CHECK(kvmap::Detail::decide_gpu_aware_mpi("1", mode, q).direct);
      CHECK_FALSE(kvmap::Detail::decide_gpu_aware_mpi("0", mode, q).direct);
      CHECK(contains(kvmap::Detail::decide_gpu_aware_mpi("0", mode, q).reason,
                     "KVMAP_GPU_AWARE_MPI=0"));
      // Unset or empty: the build decides, or in AUTO the MPI's answer (unknown: staging).
      for (const char* env : {static_cast<const char*>(nullptr), ""}) {
        const auto d = kvmap::Detail::decide_gpu_aware_mpi(env, mode, q);
        const bool expected =
            mode == GpuAwareMode::On || (mode == GpuAwareMode::Auto && q.answer == A::Yes);
        CHECK(d.direct == expected);
        if (mode == GpuAwareMode::Auto) CHECK(contains(d.reason, q.how));
      }
      for (const char* bad : {"yes", "2", "on", " 1"}) {
        CHECK_THROWS_WITH_AS(kvmap::Detail::decide_gpu_aware_mpi(bad, mode, q),
                             doctest::Contains("KVMAP_GPU_AWARE_MPI"), kvmap::Error);
      }
    }
  }
}

TEST_CASE("GPU-aware MPI: the running MPI answers for itself") {
  const MpiGpuQuery q = kvmap::Detail::query_mpi_gpu_support();
  const std::string library = library_version();
  CAPTURE(library);
  CAPTURE(q.how);
  if (contains(library, "Open MPI")) {
    CHECK(q.answer != MpiGpuQuery::Answer::Unknown);
    CHECK(q.how.rfind("Open MPI: ", 0) == 0);
  } else if (contains(library, "MPICH")) {
    CHECK(q.answer != MpiGpuQuery::Answer::Unknown);
    CHECK(q.how.rfind("MPICH: MPIX_GPU_query_support(", 0) == 0);
  }
  // The built-in decision (no override in the test environment) is AUTO's and says so.
  if (std::getenv("KVMAP_GPU_AWARE_MPI") == nullptr &&
      kvmap::Detail::built_gpu_aware_mode() == GpuAwareMode::Auto) {
    const auto d = kvmap::Detail::gpu_aware_mpi();
    CHECK(d.direct == (q.answer == MpiGpuQuery::Answer::Yes));
    CHECK(contains(d.reason, q.how));
    CHECK(kvmap::stats().gpu_aware_mpi == d.direct);
  }
}

TEST_CASE("GPU-aware MPI: KVMAP_GPU_AWARE_MPI=0 stages, =1 does not (bytes_copied)") {
  using View = kvmap::DistView<TestMemSpace>;
  const int P = world_size();
  const at::Tensor full = at::arange(23 * 6, at::kDouble).reshape({23, 6});
  const View a = View::from_global(kvmap_test::on_device(full), 0);
  RestoreDecision restore;

  // References: the two paths forced directly by the older hook.
  const auto copied_by_resplit = [&]() {
    kvmap::reset_stats();
    const View b = a.resplit(1);
    CHECK(kvmap_test::bit_equal(b.allgather().cpu(), full));
    return kvmap::stats().bytes_copied;
  };
  kvmap::Detail::set_force_host_staging(true);
  const std::uint64_t staged = copied_by_resplit();
  kvmap::Detail::set_force_host_staging(false);
  kvmap::Detail::set_host_follows_gpu_decision(true);

  setenv("KVMAP_GPU_AWARE_MPI", "0", 1);
  kvmap::Detail::redecide_gpu_aware_mpi();
  CHECK_FALSE(kvmap::stats().gpu_aware_mpi);
  CHECK(contains(kvmap::build_info(), "GPU-aware MPI no (KVMAP_GPU_AWARE_MPI=0"));
  if constexpr (kvmap::Impl::is_host_accessible<TestMemSpace>) {
    CHECK(copied_by_resplit() == staged);
  }

  setenv("KVMAP_GPU_AWARE_MPI", "1", 1);
  kvmap::Detail::redecide_gpu_aware_mpi();
  CHECK(kvmap::stats().gpu_aware_mpi);
  CHECK(contains(kvmap::build_info(), "GPU-aware MPI yes (KVMAP_GPU_AWARE_MPI=1"));
  if constexpr (kvmap::Impl::is_host_accessible<TestMemSpace>) {
    kvmap::Detail::set_host_follows_gpu_decision(false);
    const std::uint64_t direct = copied_by_resplit();
    kvmap::Detail::set_host_follows_gpu_decision(true);
    CHECK(copied_by_resplit() == direct);
    if (P > 1) CHECK(direct < staged);
  }

  setenv("KVMAP_GPU_AWARE_MPI", "maybe", 1);
  CHECK_THROWS_WITH_AS(kvmap::Detail::redecide_gpu_aware_mpi(),
                       doctest::Contains("KVMAP_GPU_AWARE_MPI='maybe'"), kvmap::Error);
}

TEST_CASE("GPU-aware MPI: a bad KVMAP_GPU_AWARE_MPI on one rank stops every rank at start") {
  RestoreDecision restore;
  const int last = world_size() - 1;
  if (world_rank() == last) {
    setenv("KVMAP_GPU_AWARE_MPI", "2", 1);
    CHECK_THROWS_AS(kvmap::Detail::redecide_gpu_aware_mpi(), kvmap::Error);
  } else {
    unsetenv("KVMAP_GPU_AWARE_MPI");
    kvmap::Detail::redecide_gpu_aware_mpi();
  }
  // What kvmap's initialization runs: every rank throws, the bad one with its own message.
  CHECK_THROWS_WITH_AS(
      kvmap::Detail::decide_gpu_aware_mpi_on_every_rank(),
      doctest::Contains(world_rank() == last ? "KVMAP_GPU_AWARE_MPI='2'" : "on another rank"),
      kvmap::Error);
  unsetenv("KVMAP_GPU_AWARE_MPI");
  kvmap::Detail::redecide_gpu_aware_mpi();
  CHECK_NOTHROW(kvmap::Detail::decide_gpu_aware_mpi_on_every_rank());
}
