// Compiled as a source of the arithmetic layer (layer 1), it includes Kokkos: the build must
// fail, since the arithmetic layer links nothing (no MPI, no Kokkos, no torch).
#include <Kokkos_Core.hpp>

int kvmap_layering_probe() {
  return 0;
}
