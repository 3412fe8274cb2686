#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs ctest.
#   scripts/test.sh                  # Kokkos 3.4.01 OpenMP+Serial from Debian's source package
#   scripts/test.sh --asan           # C++ tests under ASan + UBSan at 1 and 3 ranks
#   scripts/test.sh --fuzz           # the libFuzzer target (clang), 60 s from the seed corpus
#   scripts/test.sh --torch2         # LibTorch 2.x from PyPI's torch wheel (C++20), all tests
#                                    # but those the default run covers alike (the Python
#                                    # tests at 4 ranks, the fault-after-agreement aborts)
#   scripts/test.sh --mpich          # against Debian's MPICH and Debian's binary Kokkos 3.4.01
#                                    # (libtrilinos-kokkos-dev, Serial only) as C++20: C++ tests
#                                    # at 1 and 3 ranks, the install test, Python tests with mpi4py
#                                    # built for MPICH (skipped, with the reason, where it
#                                    # cannot be built)
#   scripts/test.sh --pip [ranks]    # pip wheel (Kokkos inside), the user's venv, Python tests, uninstall
#   scripts/test.sh --cuda-compile   # compile only, no GPU needed: libkvmap, the CudaSpace
#                                    # test executable, the Quick start and ML-potential
#                                    # examples, kvmap-perf and the Python extension against Kokkos
#                                    # 4.6.01 with the CUDA backend (nvcc >= 12 on PATH; built
#                                    # patched for CUDA 13) and the torch2 venv's CUDA torch
#                                    # wheel; fails on any warning; runs nothing
#   scripts/test.sh --hip-compile    # compile only, no GPU needed: libkvmap, the HIPSpace test
#                                    # executable and the Quick start and ML-potential examples
#                                    # with Debian's hipcc against
#                                    # Kokkos 4.6.01 with the HIP backend and Debian's CPU
#                                    # LibTorch (KVMAP_GPU_COMPILE_ONLY); runs nothing
#   scripts/test.sh --forced-kernels [--torch2]
#                                    # the numerics once more with other kernels than this CPU's
#                                    # own, older than any machine's (so every machine also sums
#                                    # in a second order): OpenBLAS (Debian's torch) as Nehalem,
#                                    # ATen's kernels without AVX2/AVX-512, the wheel's MKL at
#                                    # SSE4.2; the check_close, C++ MPI, models, examples, Python
#                                    # and ExaMiniMD model tests of that configuration (at one
#                                    # or two rank counts each)
# Extra arguments go to ctest (e.g. -R layout, -j 2); --cuda-compile and --hip-compile take none.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
preset=default
forced_kernels=0
if [ "${1:-}" = --forced-kernels ]; then
  forced_kernels=1
  shift
fi
case "${1:-}" in
  --pip) shift; exec "$(dirname "${BASH_SOURCE[0]}")/test-pip.sh" "$@" ;;
  --asan) preset=asan; shift ;;
  --fuzz) preset=fuzz; shift ;;
  --torch2) preset=torch2; shift ;;
  --mpich) preset=mpich; shift ;;
  --cuda-compile) preset=cuda-compile; shift ;;
  --hip-compile) preset=hip-compile; shift ;;
esac
if [ "$preset" = fuzz ]; then
  export KVMAP_FUZZ_DEPS=1
fi
if [ "$preset" = cuda-compile ] || [ "$preset" = hip-compile ]; then
  log="$KVMAP_SOURCE_DIR/build/$preset.compile.log"
  KVMAP_BUILD_LOG="$log" kvmap_prepare "$preset"
  # kvmap_prepare stops at the first build error (set -e, pipefail): here, every target of the
  # preset compiled and linked.
  # GCC's and clang's "warning:", and nvcc's front end's "warning #<number>-D:".
  warnings="$(grep -cE "warning( #[0-9]+-D)?:" "$log" || true)"
  grep -E "warning( #[0-9]+-D)?:" "$log" || true
  echo "[kvmap] $preset: every target of the preset compiled and linked, 0 errors, $warnings" \
    "warnings ($log); nothing runs: a compile-only check (no GPU), no ctest"
  [ "$warnings" = 0 ]
  exit 0
fi
kvmap_prepare "$preset"
# Tests run side by side, as many at once as there are cores (a multi-rank test takes as many
# as it has ranks, up to all of them): most wait on process start-up and imports, not on a
# core. CTEST_PARALLEL_LEVEL or a -j among the arguments overrides.
export CTEST_PARALLEL_LEVEL="${CTEST_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
if [ "$forced_kernels" = 1 ]; then
  export OPENBLAS_CORETYPE=Nehalem ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2
  echo "[kvmap] forced kernels: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE" \
    "ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS"
  # The rank count changes no kernel: the C++ tests at 1 and 3 ranks (one shard, uneven
  # shards), the Python ones at 3 ranks, ExaMiniMD's trained model's forces (central
  # differences, float32 against float64) at 1 (its 1,000 steps test no kernel's numerics).
  # The perf harness is left out: it checks its results, but measures no numerics of its own.
  exec ctest --preset "$preset" \
    -R '^(tolerance|distributed_hostspace_np[13]|models_np[13]|models_export|example_|python_np3|python_readme|examinimd_nn_forces_np1)' "$@"
fi
exec ctest --preset "$preset" "$@"
