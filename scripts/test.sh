#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs ctest.
#   scripts/test.sh                  # Kokkos 3.4.01 OpenMP+Serial from Debian's source package
#   scripts/test.sh --debian-kokkos  # Debian's binary libtrilinos-kokkos-dev, tests at 2 ranks + install
#   scripts/test.sh --asan           # C++ tests under ASan + UBSan at 1 and 3 ranks
#   scripts/test.sh --fuzz           # the libFuzzer target (clang), 60 s from the seed corpus
#   scripts/test.sh --torch2         # LibTorch 2.x from PyPI's torch wheel (C++20), all tests
#   scripts/test.sh --mpich          # against Debian's MPICH: C++ tests at 1-4 ranks, Python
#                                    # tests with mpi4py built for MPICH (skipped, with the
#                                    # reason, where it cannot be built)
#   scripts/test.sh --pip [ranks]    # pip install into the torch2 venv, Python tests, uninstall
#   scripts/test.sh --cuda-compile   # compile only, no GPU needed: libkvmap and the CudaSpace test
#                                    # executable against Kokkos 3.4.01 with the CUDA backend
#                                    # (nvcc >= 12 on PATH; built patched for nvcc 13) and the CUDA
#                                    # torch wheel of the torch2 venv; runs nothing
# Extra arguments go to ctest (e.g. -R layout, -j 2); --cuda-compile takes none.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
preset=default
case "${1:-}" in
  --pip) shift; exec "$(dirname "${BASH_SOURCE[0]}")/test-pip.sh" "$@" ;;
  --debian-kokkos) preset=debian-kokkos; shift ;;
  --asan) preset=asan; shift ;;
  --fuzz) preset=fuzz; shift ;;
  --torch2) preset=torch2; shift ;;
  --mpich) preset=mpich; shift ;;
  --cuda-compile) preset=cuda-compile; shift ;;
esac
if [ "$preset" = fuzz ]; then
  export KVMAP_FUZZ_DEPS=1
fi
kvmap_prepare "$preset"
if [ "$preset" = cuda-compile ]; then
  # kvmap_prepare stops at the first build error (set -e): reaching here means it compiled.
  echo "[kvmap] cuda-compile: built OK (kvmap and the CudaSpace tests, CUDA Kokkos in" \
    "$KVMAP_CUDA_KOKKOS_PREFIX); nothing runs: this is a compile-only check (no GPU), no ctest"
  exit 0
fi
exec ctest --preset "$preset" "$@"
