# Shared by run.sh and test.sh: installs what is missing, then configures and builds a preset.
# Sourced, not executed.
set -euo pipefail
KVMAP_SOURCE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

kvmap_prepare() {
  local preset="$1"
  if [ "$preset" = torch2 ]; then
    # The modern configuration: Kokkos 4.6.01 and the torch wheel.
    export KVMAP_TORCH2=1 KVMAP_KOKKOS4=1
  fi
  if [ "$preset" = mpich ]; then
    # MPICH, on Debian's binary Kokkos: one build for both.
    export KVMAP_MPICH=1 KVMAP_DEBIAN_KOKKOS=1
  fi
  if [ "$preset" = cuda-compile ]; then
    # Kokkos with the CUDA backend (and the torch2 venv's CUDA torch wheel).
    export KVMAP_CUDA=1
  fi
  if [ "$preset" = hip-compile ]; then
    # Debian's hipcc and Kokkos with the HIP backend (Debian's CPU LibTorch); the target of
    # hipcc's commands that name none (there is no GPU to ask).
    export KVMAP_HIP=1 HCC_AMDGPU_TARGET="${HCC_AMDGPU_TARGET:-gfx90a}"
  fi
  local deps
  deps="$("$KVMAP_SOURCE_DIR/scripts/install-deps.sh")"
  KVMAP_KOKKOS_PREFIX="$(tail -n1 <<<"$deps")"
  if [ "$preset" = torch2 ]; then
    KVMAP_KOKKOS_PREFIX="$(sed -n 's/^kokkos4=//p' <<<"$deps")"
  fi
  export KVMAP_KOKKOS_PREFIX
  if [ "$preset" = torch2 ] || [ "$preset" = cuda-compile ]; then
    # The preset takes LibTorch from the venv (its torch's CMake package) and its interpreter
    # (for the bindings: torch2 builds and tests them, cuda-compile compiles them for CUDA).
    local torch_python
    torch_python="$(sed -n 's/^torch2-python=//p' <<<"$deps")"
    KVMAP_TORCH_DIR="$("$torch_python" -c 'import os, torch.utils; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')"
    export KVMAP_TORCH_DIR
    export KVMAP_PYTHON="$torch_python"
  fi
  if [ "$preset" = cuda-compile ]; then
    # The preset's compiler is this prefix's nvcc_wrapper.
    KVMAP_CUDA_KOKKOS_PREFIX="$(sed -n 's/^cuda-kokkos=//p' <<<"$deps")"
    export KVMAP_CUDA_KOKKOS_PREFIX
  fi
  if [ "$preset" = hip-compile ]; then
    KVMAP_HIP_KOKKOS_PREFIX="$(sed -n 's/^hip-kokkos=//p' <<<"$deps")"
    export KVMAP_HIP_KOKKOS_PREFIX
  fi
  if [ "$preset" = mpich ]; then
    # The Python tests run where mpi4py could be built for MPICH; otherwise they are left out.
    KVMAP_PYTHON="$(sed -n 's/^mpich-python=//p' <<<"$deps")"
    if [ -n "$KVMAP_PYTHON" ]; then
      KVMAP_MPICH_PYTHON=ON
    else
      KVMAP_MPICH_PYTHON=OFF KVMAP_PYTHON=/usr/bin/python3
      echo "[kvmap] MPICH: Python tests skipped: $(sed -n 's/^mpich-python-skipped=//p' <<<"$deps")"
    fi
    export KVMAP_PYTHON KVMAP_MPICH_PYTHON
  fi
  # Compiler cache hits across checkouts in different directories: paths relative to the
  # checkout, and the build directory left out of the hash (ccache hashes it for -g builds).
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$KVMAP_SOURCE_DIR}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
  # Kokkos and LibTorch share libgomp: no pinning, no busy waiting, a fixed thread count.
  export OMP_PROC_BIND="${OMP_PROC_BIND:-false}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
  cd "$KVMAP_SOURCE_DIR"
  # KVMAP_UNITY_BUILD=1: a unity build (a few large translation units per target; CI builds each
  # configuration once on a fresh machine, where that compiles in about a third of the time).
  local unity=OFF
  if [ "${KVMAP_UNITY_BUILD:-0}" = 1 ]; then unity=ON; fi
  if [ "$preset" = cuda-compile ] || [ "$preset" = hip-compile ]; then unity=ON; fi
  cmake --preset "$preset" -DCMAKE_UNITY_BUILD="$unity" >/dev/null
  if [ -n "${KVMAP_BUILD_LOG:-}" ]; then
    # Every file compiled in this one build (ccache replays what the compiler said for the
    # ones it holds), its output kept for the warning count.
    cmake --build --preset "$preset" --clean-first 2>&1 | tee "$KVMAP_BUILD_LOG"
  else
    cmake --build --preset "$preset"
  fi
}
