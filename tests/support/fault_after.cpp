// kvmap_fault_after <site>: arms a fault in the execute phase (after the agreement) of one
// collective entry point on the last rank and calls it. kvmap must end the whole job with a
// message naming the site (MPI_Abort); returning from the call is a failure (exit 3). A rank
// other than the last one may finish its part of a call before the fault: it then waits for
// the abort instead of exiting, since a rank that exits first can make some launchers (MPICH's
// Hydra) end the job before the last rank's message is written.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "hooks.hpp"
#include "kvmap/kvmap.hpp"
#include "support/entry_points.hpp"

int main(int argc, char** argv) {
  kvmap::ScopeGuard guard(argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvmap_fault_after <site>\n");
    return 2;
  }
  const std::string site = argv[1];
  int status = 4;  // unknown site
  {
    using View = kvmap::DistView<Kokkos::HostSpace>;
    const kvmap::Comm world = kvmap::Comm::world();
    const int victim = world.size() - 1;
    const std::int64_t n = 4 * world.size() + 2;
    auto x = View::from_global(at::arange(3 * n, at::kDouble).reshape({n, 3}), 0);
    auto y = View::from_global(at::ones({n, 3}, at::kDouble), 0);
    for (const kvmap_test::EntryPoint& e : kvmap_test::entry_points(x, y, victim)) {
      if (site != e.name) continue;
      if (world.rank() == victim)
        kvmap::Detail::arm_fault(site, victim, kvmap::Detail::FaultPhase::Execute);
      e.call();
      std::fprintf(stderr,
                   "kvmap_fault_after: %s returned on rank %d although its execute phase failed\n",
                   site.c_str(), world.rank());
      status = 3;
      if (world.rank() != victim) std::this_thread::sleep_for(std::chrono::seconds(30));
    }
  }
  return status;
}
