#!/usr/bin/env bash
# Installs what kvmap needs on Debian 12, skipping what is already there:
#   1. Debian packages (LibTorch, Open MPI, doctest, pybind11, optimized BLAS, ...);
#   2. Kokkos + Kokkos Kernels 3.4.01 (OpenMP + Serial) built from Debian's own
#      trilinos source package into a reusable prefix;
#   3. with KVMAP_TORCH2=1: LibTorch 2.x from PyPI's torch wheel, in a venv of Python >= 3.12
#      with mpi4py, pybind11, pytest, Heat and nlohmann-json (the header torch's headers
#      include but do not ship) (the Python side of the torch2 configuration);
#   4. with KVMAP_MPICH=1: Debian's MPICH beside Open MPI, and a venv of Debian's Python (its
#      torch 1.13 included) with mpi4py built from PyPI's source for MPICH;
#   5. with KVMAP_KOKKOS4=1: Kokkos + Kokkos Kernels 4.6.01 (OpenMP + Serial, C++20) from
#      their release archives ($KVMAP_SOURCES or ../shared/third_party, else downloaded;
#      sha256 checked), the modern configuration's Kokkos;
#   6. with KVMAP_CUDA=1 (implies KVMAP_TORCH2=1): Kokkos + Kokkos Kernels 4.6.01 with the
#      CUDA backend (Hopper, + Serial, C++20) patched for CUDA 13
#      (scripts/patches/kokkos-4.6.01-cuda13.patch), for the compile-only CUDA build. Needs
#      nvcc (>= 12) on PATH, not a GPU;
#   7. with KVMAP_HIP=1: Debian's hipcc (ROCm 5.2) and Kokkos + Kokkos Kernels 4.6.01 with the
#      HIP backend (gfx90a, + Serial), for the compile-only HIP build. Needs no GPU.
#
# Environment:
#   KVMAP_DEPS_PREFIX  where Kokkos is installed (default: $XDG_CACHE_HOME/kvmap or ~/.cache/kvmap)
#   KVMAP_SKIP_APT=1   do not touch Debian packages (everything already installed)
#   KVMAP_DEBIAN_KOKKOS=1  also install Debian's binary libtrilinos-kokkos-dev (Serial only)
#   KVMAP_DOCS=1       also install doxygen (scripts/docs.sh)
#   KVMAP_TORCH2=1     also make the torch2 venv ($KVMAP_DEPS_PREFIX/torch2-venv)
#   KVMAP_TORCH2_SPEC  the pip requirement for torch (default: the tested range below)
#   KVMAP_TORCH2_BASE_PYTHON  the Python >= 3.12 the venv is made from (default: python3.12
#                      on PATH or in pyenv, else a newer one)
#   KVMAP_MPICH=1      also install MPICH and make the MPICH venv ($KVMAP_DEPS_PREFIX/mpich-venv)
#   KVMAP_KOKKOS4=1    also build Kokkos 4.6.01 ($KVMAP_DEPS_PREFIX/kokkos-4.6.01)
#   KVMAP_CUDA=1       also build the CUDA Kokkos ($KVMAP_DEPS_PREFIX/kokkos-4.6.01-cuda)
#   KVMAP_HIP=1        also install hipcc and build the HIP Kokkos (.../kokkos-4.6.01-hip)
#   KVMAP_SOURCES      where the Kokkos 4.6.01 archives are (default ../shared/third_party)
# Prints "torch2-python=<venv python>" and "wheelhouse=<dir of its wheels>" (with KVMAP_TORCH2=1), "mpich-python=<venv python>" or
# "mpich-python-skipped=<reason>" (with KVMAP_MPICH=1), "kokkos4=<prefix>",
# "cuda-kokkos=<prefix>", "hip-kokkos=<prefix>" (with KVMAP_KOKKOS4, KVMAP_CUDA, KVMAP_HIP),
# then the Kokkos 3.4.01 (OpenMP) prefix on its last line.
set -euo pipefail

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/kvmap"
prefix="${KVMAP_DEPS_PREFIX:-$cache_root}/kokkos-3.4.01"
if [ "${KVMAP_CUDA:-0}" = 1 ]; then
  # The CUDA build compiles against the CUDA torch wheel of the torch2 venv.
  KVMAP_TORCH2=1
fi
jobs="$(nproc 2>/dev/null || echo 2)"

log() { echo "[kvmap-deps] $*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo "$@"
  else
    log "need root to run: $*"
    log "run this script as root or with passwordless sudo, or install these Debian packages yourself"
    log "and rerun with KVMAP_SKIP_APT=1: ${packages[*]}"
    exit 1
  fi
}

# What the README's Quick start says these scripts install (tests/readme_prerequisites.py
# checks that it names exactly this list): build tools; LibTorch with an optimized BLAS, Open
# MPI, doctest; the Python bindings' build and test dependencies; the test suite's tools
# (callgrind instruction counts, the format check, the perf plot's test).
packages=(
  build-essential cmake ninja-build ccache
  libtorch-dev libopenblas0-openmp libopenmpi-dev openmpi-bin doctest-dev
  python3 python3-dev pybind11-dev python3-torch python3-mpi4py python3-pytest python3-numpy
  valgrind clang-format python3-matplotlib
)
if [ "${1:-}" = --list-packages ]; then
  echo "${packages[*]}"
  exit 0
fi
if [ "${KVMAP_FUZZ_DEPS:-0}" = 1 ]; then
  packages+=(clang libclang-rt-14-dev)
fi
if [ "${KVMAP_DOCS:-0}" = 1 ]; then
  packages+=(doxygen)
fi
if [ "${KVMAP_DEBIAN_KOKKOS:-0}" = 1 ]; then
  packages+=(libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev)
fi
if [ "${KVMAP_MPICH:-0}" = 1 ]; then
  # Open MPI stays the `mpi` alternative; MPICH's tools are mpicxx.mpich, mpiexec.mpich, ...
  packages+=(libmpich-dev mpich python3-venv)
fi
if [ "${KVMAP_HIP:-0}" = 1 ]; then
  # ROCm 5.2 from Debian; NVIDIA's Thrust headers stand in for rocThrust, which LibTorch's
  # c10/util/complex.h includes under hipcc (with THRUST_DEVICE_SYSTEM=CPP).
  packages+=(hipcc libamdhip64-dev rocm-device-libs libthrust-dev)
fi
if [ "${KVMAP_TORCH2:-0}" = 1 ]; then
  packages+=(python3-venv)
fi

missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

apt_updated=0
apt_update_once() {
  if [ "$apt_updated" = 0 ]; then
    as_root apt-get update -q >&2
    apt_updated=1
  fi
}

if [ "${KVMAP_SKIP_APT:-0}" != 1 ]; then
  mapfile -t missing < <(missing_packages "${packages[@]}")
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    apt_update_once
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "${missing[@]}" >&2
  else
    log "Debian packages: all present"
  fi
fi

# ---- LibTorch 2.x: PyPI's torch wheel in a venv -------------------------------------------
# Tested: torch 2.14 (CUDA 13 wheel, runs on CPU-only machines) with Heat 1.9.0, which needs
# Python >= 3.12. The range holds only what kvmap was tested with.
torch2_spec="${KVMAP_TORCH2_SPEC:-torch>=2.14,<2.15}"
# nlohmann-json: the header torch 2.x's ATen/functorch headers include but the wheel does not
# ship (cmake/KvmapTorch.cmake finds it in the venv, as pip's build finds its build requirement).
torch2_extras=(heat==1.9.0 "mpi4py>=4" "pybind11>=2.11" pytest numpy "nlohmann-json>=3.11")

python_at_least_312() {
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null
}
find_base_python() {
  local c
  # The oldest that qualifies: 3.12 is the tested one.
  for c in "${KVMAP_TORCH2_BASE_PYTHON:-}" python3.12 \
           $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V) python3.13; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && python_at_least_312 "$c"; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

if [ "${KVMAP_TORCH2:-0}" = 1 ]; then
  venv="${KVMAP_DEPS_PREFIX:-$cache_root}/torch2-venv"
  wheelhouse="${KVMAP_DEPS_PREFIX:-$cache_root}/wheelhouse"
  stamp="$venv/.kvmap-complete"
  want="$torch2_spec ${torch2_extras[*]}"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    log "torch2 venv: present in $venv ($("$venv/bin/python" -c 'import torch; print(torch.__version__)'))"
  else
    base="$(find_base_python)" || {
      log "the torch2 configuration needs Python >= 3.12 (Heat 1.9 requires it); none found on PATH"
      log "or in pyenv. Set KVMAP_TORCH2_BASE_PYTHON to one."
      exit 1
    }
    log "making the torch2 venv in $venv from $base: $want (the torch wheel is about 3 GB)"
    rm -rf "$venv"
    "$base" -m venv "$venv" >&2
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    # Heat pins torch itself; both in one resolution, so the venv holds one torch. The wheels
    # are kept in a wheelhouse (pip's own cache does not keep downloads that the index or a
    # proxy marks uncacheable), from which the pip step's venvs install them again.
    "$venv/bin/python" -m pip download -q -d "$wheelhouse" "$torch2_spec" "${torch2_extras[@]}" >&2
    "$venv/bin/python" -m pip install -q --no-index --find-links "$wheelhouse" "$torch2_spec" "${torch2_extras[@]}" >&2
    echo "$want" >"$stamp"
    log "torch2 venv: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
  fi
  echo "torch2-python=$venv/bin/python"
  echo "wheelhouse=$wheelhouse"
fi

# ---- MPICH: mpi4py built for it, in a venv of Debian's Python -------------------------------
# Debian's python3-mpi4py is built for Open MPI; PyPI's mpi4py source builds for the mpicc it
# is given. The venv sees Debian's packages (torch 1.13, numpy, pytest) and puts its own mpi4py
# first. When the build fails, the MPICH configuration runs without Python, and says why.
if [ "${KVMAP_MPICH:-0}" = 1 ]; then
  mvenv="${KVMAP_DEPS_PREFIX:-$cache_root}/mpich-venv"
  mstamp="$mvenv/.kvmap-complete"
  mwant="mpi4py>=4 for $(mpichversion 2>/dev/null | sed -n 's/^MPICH Version:[[:space:]]*//p')"
  if [ -f "$mstamp" ] && [ "$(cat "$mstamp")" = "$mwant" ] && "$mvenv/bin/python" -c 'import mpi4py' 2>/dev/null; then
    log "MPICH venv: present in $mvenv ($mwant)"
    echo "mpich-python=$mvenv/bin/python"
  else
    log "making the MPICH venv in $mvenv: $mwant (mpi4py compiled from source)"
    rm -rf "$mvenv"
    mlog="$(mktemp)"
    if /usr/bin/python3 -m venv --system-site-packages "$mvenv" >"$mlog" 2>&1 &&
       env MPICC=mpicc.mpich "$mvenv/bin/python" -m pip install -q --no-binary=mpi4py "mpi4py>=4" >>"$mlog" 2>&1 &&
       "$mvenv/bin/python" -c 'from mpi4py import MPI; import sys; sys.exit("MPICH" not in MPI.Get_library_version())' >>"$mlog" 2>&1; then
      echo "$mwant" >"$mstamp"
      log "MPICH venv: $("$mvenv/bin/python" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])')"
      echo "mpich-python=$mvenv/bin/python"
    else
      tail -n 20 "$mlog" >&2
      echo "mpich-python-skipped=mpi4py could not be built for MPICH from PyPI (log above)"
    fi
    rm -f "$mlog"
  fi
fi

# ---- Kokkos + Kokkos Kernels 4.6.01 from their release archives ----------------------------
# The archives come from $KVMAP_SOURCES (default: ../shared/third_party beside the checkout)
# or, where they are not, from the upstream release URLs; their sha256 (the ones spack's
# recipes list) is checked either way. OpenMP + Serial for the modern configuration; with
# KVMAP_CUDA=1 also CUDA + Serial (Hopper, patched for CUDA 13:
# scripts/patches/kokkos-4.6.01-cuda13.patch); with KVMAP_HIP=1 also HIP + Serial (gfx90a,
# Debian's hipcc). Shared libraries, so that they link into a shared libkvmap.
repo_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=kokkos-sources.sh
source "$repo_dir/scripts/kokkos-sources.sh"

# build_kokkos_and_kernels KOKKOS_SRC KERNELS_SRC BUILD_DIR PREFIX LABEL [CMAKE ARGS...]:
# Kokkos from KOKKOS_SRC, then Kokkos Kernels against it, into PREFIX (shared libraries with an
# RPATH), built in BUILD_DIR/kokkos and BUILD_DIR/kernels. -DCMAKE_* arguments (compiler, C++
# standard) go to both builds, -DKokkosKernels_* ones to Kokkos Kernels, the others (backends,
# architecture) to Kokkos. Kokkos Kernels without explicit instantiations (kvmap's few calls
# instantiate from headers in its own translation units, which turns a many-minute build into
# seconds), tests or TPLs (BLAS; cuBLAS and cuSPARSE, whose legacy API that Kokkos Kernels 3.4
# calls CUDA 12 removed).
build_kokkos_and_kernels() {
  local ksrc="$1" kksrc="$2" bdir="$3" kprefix="$4" label="$5"
  shift 5
  local both=() core=() kernels=() arg
  for arg in "$@"; do
    case "$arg" in
      -DCMAKE_*) both+=("$arg") ;;
      -DKokkosKernels_*) kernels+=("$arg") ;;
      *) core+=("$arg") ;;
    esac
  done
  local common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$kprefix"
    -DBUILD_SHARED_LIBS=ON -DCMAKE_INSTALL_RPATH="$kprefix/lib"
    -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON "${both[@]}")
  if command -v ccache >/dev/null 2>&1; then common+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  log "building Kokkos $label (${core[*]}) into $kprefix"
  cmake -S "$ksrc" -B "$bdir/kokkos" "${common[@]}" \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_TESTS=OFF "${core[@]}" >&2
  cmake --build "$bdir/kokkos" -j "$jobs" >&2
  cmake --install "$bdir/kokkos" >&2
  log "building Kokkos Kernels $label into $kprefix"
  cmake -S "$kksrc" -B "$bdir/kernels" "${common[@]}" \
    -DKokkos_ROOT="$kprefix" -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF \
    -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF \
    -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF \
    -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_INST_ORDINAL_INT64_T=OFF \
    -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF \
    -DKokkosKernels_INST_LAYOUTLEFT=OFF -DKokkosKernels_INST_LAYOUTRIGHT=OFF \
    -DKokkosKernels_ENABLE_TPL_BLAS=OFF -DKokkosKernels_ENABLE_TPL_CUBLAS=OFF \
    -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF "${kernels[@]}" >&2
  cmake --build "$bdir/kernels" -j "$jobs" >&2
  cmake --install "$bdir/kernels" >&2
}

# build_kokkos4 VARIANT PREFIX [PATCH|-] [CMAKE ARGS...]: Kokkos and Kokkos Kernels 4.6.01
# into PREFIX from the release archives, with PATCH applied to Kokkos first; of Kokkos Kernels
# the BLAS and batched components kvmap calls.
build_kokkos4() {
  local variant="$1" kprefix="$2" kpatch="$3" archive
  shift 3
  local tree="$cache_root/src/kokkos-$kokkos4_version-$variant"
  rm -rf "$tree" "$kprefix" && mkdir -p "$tree"
  for archive in $(kokkos4_archives); do tar -xzf "$archive" -C "$tree"; done
  if [ "$kpatch" != - ]; then
    log "patching Kokkos $kokkos4_version: $kpatch"
    patch -d "$tree/kokkos-$kokkos4_version" -p1 --quiet <"$kpatch" >&2
  fi
  build_kokkos_and_kernels "$tree/kokkos-$kokkos4_version" "$tree/kokkos-kernels-$kokkos4_version" \
    "$tree" "$kprefix" "$kokkos4_version ($variant)" "$@" \
    -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
    -DKokkosKernels_ENABLE_COMPONENT_BATCHED=ON -DKokkosKernels_ENABLE_TPL_LAPACK=OFF \
    -DKokkosKernels_ENABLE_TPL_CUSOLVER=OFF -DKokkosKernels_ENABLE_TPL_ROCBLAS=OFF \
    -DKokkosKernels_ENABLE_TPL_ROCSPARSE=OFF -DKokkosKernels_ENABLE_TPL_ROCSOLVER=OFF
  rm -rf "$tree"
}

# kokkos4 VARIANT PREFIX STAMP PATCH ARGS...: builds unless PREFIX has this STAMP.
kokkos4() {
  local variant="$1" kprefix="$2" stamp="$3"
  if [ -f "$kprefix/.kvmap-complete" ] && [ "$(cat "$kprefix/.kvmap-complete")" = "$stamp" ]; then
    log "Kokkos $kokkos4_version ($variant) and Kokkos Kernels: present in $kprefix"
  else
    shift 3
    build_kokkos4 "$variant" "$kprefix" "$@"
    echo "$stamp" >"$kprefix/.kvmap-complete"
    log "done: $kprefix"
  fi
}

if [ "${KVMAP_KOKKOS4:-0}" = 1 ]; then
  kokkos4 openmp "${KVMAP_DEPS_PREFIX:-$cache_root}/kokkos-$kokkos4_version" "$kokkos4_sha256" - \
    -DCMAKE_CXX_STANDARD=20 -DKokkos_ENABLE_OPENMP=ON
  echo "kokkos4=${KVMAP_DEPS_PREFIX:-$cache_root}/kokkos-$kokkos4_version"
fi
if [ "${KVMAP_CUDA:-0}" = 1 ]; then
  command -v nvcc >/dev/null 2>&1 || {
    log "KVMAP_CUDA=1 needs nvcc (CUDA >= 12) on PATH"
    exit 1
  }
  cuda4_patch="$repo_dir/scripts/patches/kokkos-$kokkos4_version-cuda13.patch"
  cuda4_prefix="${KVMAP_DEPS_PREFIX:-$cache_root}/kokkos-$kokkos4_version-cuda"
  # nvcc_wrapper of the patched tree compiles Kokkos and Kokkos Kernels; the installed one
  # compiles kvmap.
  kokkos4 cuda "$cuda4_prefix" "$kokkos4_sha256 $(sha256sum "$cuda4_patch" | cut -d' ' -f1)" \
    "$cuda4_patch" -DCMAKE_CXX_STANDARD=20 \
    -DCMAKE_CXX_COMPILER="$cache_root/src/kokkos-$kokkos4_version-cuda/kokkos-$kokkos4_version/bin/nvcc_wrapper" \
    -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON -DKokkos_ARCH_HOPPER90=ON
  echo "cuda-kokkos=$cuda4_prefix"
fi
if [ "${KVMAP_HIP:-0}" = 1 ]; then
  hip4_prefix="${KVMAP_DEPS_PREFIX:-$cache_root}/kokkos-$kokkos4_version-hip"
  # hipcc asks the machine's GPUs for a target when a command names none (linking, CMake's
  # compiler checks): there are none here.
  export HCC_AMDGPU_TARGET="${HCC_AMDGPU_TARGET:-gfx90a}"
  # Debian 12 has no rocThrust: Kokkos without it.
  kokkos4 hip "$hip4_prefix" "$kokkos4_sha256 hip" - -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_CXX_COMPILER=hipcc -DKokkos_ENABLE_HIP=ON -DKokkos_ARCH_AMD_GFX90A=ON \
    -DKokkos_ENABLE_ROCTHRUST=OFF
  echo "hip-kokkos=$hip4_prefix"
fi

# ---- Kokkos + Kokkos Kernels 3.4.01 from Debian's trilinos source package ----------------
if [ -f "$prefix/.kvmap-complete" ]; then
  log "Kokkos 3.4.01 (OpenMP+Serial) and Kokkos Kernels: present in $prefix"
  echo "$prefix"
  exit 0
fi

# deb-src entries derived from this machine's own Debian sources: same mirrors, same suites.
enable_deb_src() {
  if apt-get source --print-uris trilinos >/dev/null 2>&1; then return 0; fi
  local src=/etc/apt/sources.list.d/debian.sources out=/etc/apt/sources.list.d/kvmap-deb-src.sources
  local tmp
  tmp="$(mktemp)"
  if [ -f "$src" ]; then
    sed -e 's/^Types:.*/Types: deb-src/' "$src" >"$tmp"
  elif [ -f /etc/apt/sources.list ]; then
    out=/etc/apt/sources.list.d/kvmap-deb-src.list
    sed -n -e 's/^deb \(.*\)$/deb-src \1/p' /etc/apt/sources.list >"$tmp"
  else
    log "found no Debian sources to derive deb-src entries from"
    exit 1
  fi
  log "enabling deb-src entries derived from the machine's Debian sources ($out)"
  as_root install -m 0644 "$tmp" "$out"
  rm -f "$tmp"
  apt_updated=0
  apt_update_once
}

work="$cache_root/src"
mkdir -p "$work"
orig="$(ls "$work"/trilinos_*.orig.tar.* 2>/dev/null | head -n1 || true)"
if [ -z "$orig" ]; then
  enable_deb_src
  log "downloading Debian's trilinos source package"
  (cd "$work" && apt-get source --download-only -q trilinos >&2)
  orig="$(ls "$work"/trilinos_*.orig.tar.* | head -n1)"
fi

# extract_tree DIR: packages/kokkos and packages/kokkos-kernels of the source package into DIR.
extract_tree() {
  log "extracting packages/kokkos and packages/kokkos-kernels from $(basename "$orig") into $1"
  rm -rf "$1" && mkdir -p "$1"
  tar -xf "$orig" -C "$1" --strip-components=1 --wildcards \
    '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
}

if [ -f "$prefix/.kvmap-complete" ]; then
  log "Kokkos 3.4.01 (OpenMP+Serial) and Kokkos Kernels: present in $prefix"
else
  tree="$work/trilinos"
  if [ ! -f "$tree/packages/kokkos/CMakeLists.txt" ] || [ ! -f "$tree/packages/kokkos-kernels/CMakeLists.txt" ]; then
    extract_tree "$tree"
  fi
  build_kokkos_and_kernels "$tree/packages/kokkos" "$tree/packages/kokkos-kernels" "$work/build" \
    "$prefix" 3.4.01 -DCMAKE_CXX_STANDARD=17 -DKokkos_ENABLE_OPENMP=ON
  touch "$prefix/.kvmap-complete"
  log "done: $prefix"
fi

echo "$prefix"
