// Must not compile: a view of const elements adopted as a DistView would become writable.
#include <kvmap/dist_view.hpp>

int main() {
  Kokkos::View<const double*> readonly = Kokkos::View<double*>("data", 4);
  auto x = kvmap::DistView<>::from_local(readonly, 0);
  (void)x;
  return 0;
}
