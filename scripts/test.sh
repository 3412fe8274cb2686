#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs ctest.
#   scripts/test.sh                  # Kokkos 3.4.01 OpenMP+Serial from Debian's source package
#   scripts/test.sh --debian-kokkos  # Debian's binary libtrilinos-kokkos-dev, tests at 2 ranks
# Extra arguments go to ctest (e.g. -R layout, -j 2).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
preset=default
if [ "${1:-}" = --debian-kokkos ]; then
  preset=debian-kokkos
  shift
fi
kvmap_prepare "$preset"
exec ctest --preset "$preset" "$@"
