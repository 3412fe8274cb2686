// The control of the layering probes: a source of the platform layer including the platform
// layer's own private headers and the arithmetic layer's compiles.
#include "hash.hpp"
#include "mpi_transport.hpp"

int kvmap_layering_probe() {
  return 0;
}
