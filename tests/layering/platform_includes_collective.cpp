// Compiled as a source of the platform layer (layer 2), it includes a header of the collective
// layer (layer 3): the build must fail, since a layer sees only its own and lower layers'
// headers (runtime/CMakeLists.txt, tests/CMakeLists.txt: layering_*).
#include "agreement.hpp"

int kvmap_layering_probe() {
  return 0;
}
