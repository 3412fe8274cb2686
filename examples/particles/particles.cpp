// particles: a Kokkos application holding particle positions in a View<double*[3]> per
// rank, computing a per-particle energy with a torch function through kvmap::vmap on the
// positions adopted without copies, and reducing it.
#include <kvmap/kvmap.hpp>

#include <ATen/ATen.h>
#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  kvmap::ScopeGuard guard(argc, argv);
  int rc = 0;
  {
    const kvmap::Comm world = kvmap::Comm::world();
    const int me = world.rank();
    // Uneven on purpose: rank r owns 1000 + 7 r particles, numbered after those of lower ranks.
    const std::int64_t n = 1000 + 7 * me;
    const std::int64_t first = 1000 * me + 7 * me * (me - 1) / 2;
    Kokkos::View<double* [3]> positions("positions", n);
    Kokkos::parallel_for(
        "init", n, KOKKOS_LAMBDA(const std::int64_t i) {
          const double g = static_cast<double>(first + i);
          positions(i, 0) = std::sin(g);
          positions(i, 1) = std::cos(0.5 * g);
          positions(i, 2) = 1e-3 * g;
        });
    Kokkos::fence();

    kvmap::reset_stats();
    auto x = kvmap::DistView<>::from_local(positions, 0, world);  // shares the View's memory
    // A plain tensor argument lives where the particles do (CPU, or the Kokkos GPU).
    const at::Tensor centre = at::tensor({0.1, 0.2, 0.3}, x.local().options());
    // Written for one particle p of shape (3,).
    auto energy = [](const at::Tensor& p, const at::Tensor& c) {
      return 0.5 * p.dot(p) + at::exp(-(p - c).pow(2).sum());
    };
    auto e = kvmap::vmap(energy)(x, centre);

    // Reduce on the Kokkos side, from a typed view of kvmap's output.
    auto ev = e.local_view<double*, Kokkos::LayoutRight>();
    double local = 0.0;
    Kokkos::parallel_reduce(
        "sum", ev.extent(0), KOKKOS_LAMBDA(const std::size_t i, double& s) { s += ev(i); }, local);
    // The application's own MPI, on kvmap's duplicate of the world.
    double total = 0.0;
    MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, world.raw());
    const auto mine = static_cast<std::int64_t>(kvmap::stats().bytes_copied);
    std::int64_t copied = 0;
    MPI_Allreduce(&mine, &copied, 1, MPI_INT64_T, MPI_MAX, world.raw());
    if (me == 0) {
      std::printf("particles: %lld on %d ranks\n", static_cast<long long>(e.gshape()[0]),
                  world.size());
      std::printf("total energy = %.12f\n", total);
      std::printf("bytes copied = %lld\n", static_cast<long long>(copied));
    }
    if (copied != 0) rc = 1;
  }
  return rc;
}
