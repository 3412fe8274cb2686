#!/usr/bin/env bash
# kvmap on a real GPU, on a machine with nvcc, a CUDA torch wheel and no network: builds Kokkos
# and Kokkos Kernels (CUDA + Serial) from source trees it is given, then kvmap against them,
# runs the CudaSpace test suite at 1 rank (and 2 where an MPI launcher is there), the Python
# tests with DistViews on the GPU (where --python has mpi4py, pybind11 and pytest) and
# kvmap-perf's overhead, chunks and zero-copy scenarios, and writes everything under one
# results directory.
#
#   scripts/gpu-check.sh [--kokkos-src DIR --kernels-src DIR] [--doctest-src DIR]
#                        [--out DIR] [--arch KOKKOS_ARCH] [--jobs N] [--python PY]
#
#   --kokkos-src   a Kokkos source tree (4.x, or Debian's trilinos packages/kokkos 3.4.01);
#                  kvmap's CUDA 13 patch for that version (scripts/patches) is applied to it
#                  when nvcc is 13 or newer and the tree is not patched yet. Default: Kokkos
#                  4.6.01 from the release archive install-deps.sh uses ($KVMAP_SOURCES or
#                  ../shared/third_party, which travels with the working tree; sha256 checked)
#   --kernels-src  the Kokkos Kernels source tree of a matching version (default: 4.6.01, as
#                  above)
#   --doctest-src  a doctest source tree, where the machine has no doctest package
#   --out          results directory (default: gpu-check-<date>-<host>); its build/ holds
#                  the builds, results.txt the summary
#   --arch         Kokkos architecture option (default: from nvidia-smi's compute capability,
#                  e.g. HOPPER90 for 9.0; Kokkos 3.4 knows up to AMPERE86)
#   --python       the Python whose torch is the CUDA LibTorch (default: python3)
# Exits non-zero when a build or a test fails; results.txt says which.
set -euo pipefail
src_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kokkos_src="" kernels_src="" doctest_src="" out="" arch="" python="python3"
jobs="$(nproc 2>/dev/null || echo 4)"
while [ $# -gt 0 ]; do
  case "$1" in
    --kokkos-src) kokkos_src="$(cd "$2" && pwd)"; shift 2 ;;
    --kernels-src) kernels_src="$(cd "$2" && pwd)"; shift 2 ;;
    --doctest-src) doctest_src="$(cd "$2" && pwd)"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
out="${out:-gpu-check-$(date +%Y%m%d-%H%M)-$(hostname -s)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [ -z "$kokkos_src" ] && [ -z "$kernels_src" ]; then
  # The archives install-deps.sh builds from, unpacked here (fetch_source checks the sha256).
  cache_root="$out"
  log() { echo "[gpu-check] $*" >&2; }
  # shellcheck source=kokkos-sources.sh
  source "$src_dir/scripts/kokkos-sources.sh"
  mkdir -p "$out/src"
  for archive in $(kokkos4_archives); do tar -xzf "$archive" -C "$out/src"; done
  kokkos_src="$out/src/kokkos-$kokkos4_version" kernels_src="$out/src/kokkos-kernels-$kokkos4_version"
fi
[ -n "$kokkos_src" ] && [ -n "$kernels_src" ] || { echo "gpu-check: give both --kokkos-src and --kernels-src, or neither" >&2; exit 2; }
results="$out/results.txt"
: >"$results"
say() { echo "[gpu-check] $*" | tee -a "$results"; }
fail() { say "FAILED: $*"; exit 1; }
# Runs a step with its output in $out/<name>.log; the step's status goes to results.txt.
step() {
  local name="$1"; shift
  local t0=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then
    say "$name: ok ($((SECONDS - t0)) s)"
  else
    local rc=$?
    tail -n 40 "$out/$name.log" | sed 's/^/    /' | tee -a "$results"
    fail "$name (exit $rc after $((SECONDS - t0)) s; $out/$name.log)"
  fi
}

# ---- what the machine has --------------------------------------------------------------
command -v nvcc >/dev/null || fail "no nvcc on PATH"
command -v nvidia-smi >/dev/null || fail "no nvidia-smi: no GPU driver here"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || fail "nvidia-smi sees no GPU"
cuda_version="$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
gpu="$(nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader | head -n1)"
torch_dir="$("$python" -c 'import os, torch.utils; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')" \
  || fail "$python has no torch"
torch_version="$("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')"
kokkos_version="$(sed -n 's/^set(Kokkos_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$kokkos_src/CMakeLists.txt" | paste -sd. -)"
[ -n "$kokkos_version" ] || fail "no Kokkos version in $kokkos_src/CMakeLists.txt"
mpicxx="$(command -v mpicxx || true)"
mpiexec="$(command -v mpiexec || true)"
say "kvmap $(git -C "$src_dir" rev-parse --short HEAD 2>/dev/null || echo '(no git)') on $(hostname -s), $(date -u +%Y-%m-%dT%H:%MZ)"
say "GPU: $gpu; nvcc $cuda_version; torch $torch_version ($python)"
say "Kokkos $kokkos_version ($kokkos_src), Kokkos Kernels ($kernels_src)"
say "MPI: ${mpicxx:-no mpicxx}; launcher ${mpiexec:-none}"
# The Python bindings where the Python has what they need (its torch is the CUDA LibTorch).
if "$python" -c 'import mpi4py, pybind11, pytest' >/dev/null 2>&1; then
  with_python=ON
else
  with_python=OFF
  say "python: skipped ($python lacks mpi4py, pybind11 or pytest)"
fi
[ -n "$mpicxx" ] || fail "kvmap needs an MPI (mpicxx) to build; none on PATH"

if [ -z "$arch" ]; then
  cc="$(cut -d, -f2 <<<"$gpu" | tr -d ' .')"
  case "$cc" in
    70) arch=VOLTA70 ;; 75) arch=TURING75 ;; 80) arch=AMPERE80 ;; 86) arch=AMPERE86 ;;
    89) arch=ADA89 ;; 90) arch=HOPPER90 ;; 100) arch=BLACKWELL100 ;; 120) arch=BLACKWELL120 ;;
    *) fail "no Kokkos architecture known for compute capability $cc: pass --arch" ;;
  esac
  # Kokkos 3.4 knows no Hopper: its Ampere code runs there through the PTX it embeds.
  if [ "${kokkos_version%%.*}" -lt 4 ] && [ "$cc" -gt 86 ]; then arch=AMPERE80; fi
fi
say "Kokkos_ARCH_$arch"

# ---- Kokkos: kvmap's CUDA 13 patch where one exists for this version ---------------------
patch_file="$src_dir/scripts/patches/kokkos-$kokkos_version-cuda13.patch"
if [ "${cuda_version%%.*}" -ge 13 ] && [ -f "$patch_file" ]; then
  # Paths in the patch are relative to a trilinos tree (a/packages/kokkos/...) or to Kokkos'.
  strip=1
  if grep -q '^--- a/packages/kokkos/' "$patch_file"; then strip=3; fi
  if patch -d "$kokkos_src" -p"$strip" -R --dry-run -s -f <"$patch_file" >/dev/null 2>&1; then
    say "$(basename "$patch_file"): already applied"
  else
    step kokkos-patch patch -d "$kokkos_src" -p"$strip" -s -f -i "$patch_file"
  fi
fi

prefix="$out/build/prefix"
build="$out/build"
# C++20: LibTorch >= 2.14 requires it; Kokkos 3.4 accepts it with nvcc >= 12 once patched.
cxx_std=20
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=ON
  -DCMAKE_INSTALL_RPATH="$prefix/lib" -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON)
step kokkos-configure cmake -S "$kokkos_src" -B "$build/kokkos" "${common[@]}" \
  -DCMAKE_CXX_COMPILER="$kokkos_src/bin/nvcc_wrapper" -DCMAKE_CXX_STANDARD="$cxx_std" \
  -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ENABLE_SERIAL=ON \
  -DKokkos_ARCH_"$arch"=ON -DKokkos_ENABLE_TESTS=OFF
step kokkos-build cmake --build "$build/kokkos" -j "$jobs" --target install
step kernels-configure cmake -S "$kernels_src" -B "$build/kernels" "${common[@]}" \
  -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DKokkos_ROOT="$prefix" \
  -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF \
  -DKokkosKernels_ENABLE_TPL_BLAS=OFF -DKokkosKernels_ENABLE_TPL_CUBLAS=OFF \
  -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF
step kernels-build cmake --build "$build/kernels" -j "$jobs" --target install
if [ -n "$doctest_src" ]; then
  step doctest-install cmake -S "$doctest_src" -B "$build/doctest" -G Ninja \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DDOCTEST_WITH_TESTS=OFF
  cmake --install "$build/doctest" >>"$out/doctest-install.log" 2>&1
fi

# ---- kvmap ---------------------------------------------------------------------------------
step kvmap-configure cmake -S "$src_dir" -B "$build/kvmap" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DCMAKE_PREFIX_PATH="$prefix" \
  -DTorch_DIR="$torch_dir" -DMPI_CXX_COMPILER="$mpicxx" ${mpiexec:+-DMPIEXEC_EXECUTABLE="$mpiexec"} \
  -DKVMAP_PYTHON="$with_python" -DPython_EXECUTABLE="$(command -v "$python")" -DKVMAP_ENABLE_EXAMPLES=OFF -DKVMAP_ENABLE_PERF=ON -DKVMAP_ENABLE_TESTS=ON
python_target=""
[ "$with_python" = ON ] && python_target=_kvmap
step kvmap-build cmake --build "$build/kvmap" -j "$jobs" --target kvmap_test_distributed_cudaspace kvmap-perf $python_target

# ---- runs ----------------------------------------------------------------------------------
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_PROC_BIND="${OMP_PROC_BIND:-false}"
tests="$build/kvmap/tests/kvmap_test_distributed_cudaspace"
perf="$build/kvmap/perf/kvmap-perf"
launch="$build/kvmap/kvmap-mpiexec"
# One rank needs no launcher (MPI's singleton start).
step cudaspace-np1 timeout 900 "$tests" --test-case-exclude='soak*'
if [ -n "$mpiexec" ] && [ -x "$launch" ]; then
  step cudaspace-np2 timeout 900 "$launch" -n 2 "$tests" --test-case-exclude='soak*'
else
  say "cudaspace-np2: skipped (no MPI launcher)"
fi
if [ "$with_python" = ON ]; then
  # The whole Python suite with this build: its device tests run DistViews on the GPU.
  step python-np1 env PYTHONPATH="$build/kvmap/python" timeout 900 "$python" -m pytest -q -p no:cacheprovider \
    -rs "$src_dir/bindings/python/tests"
  grep -E "passed|skipped" "$out/python-np1.log" | tail -n 1 | sed "s/^/    /" >>"$results" || true
fi
step perf-np1 timeout 900 "$perf" --scenario overhead,chunks,zero-copy --json "$out/perf-np1.json"
grep -m1 "^kvmap-perf: kvmap" "$out/perf-np1.log" | sed "s/^/    /" >>"$results" || true
say "OK: results in $out"
