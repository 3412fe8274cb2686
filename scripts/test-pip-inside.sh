#!/usr/bin/env bash
# The pip test's steps as a Heat user takes them, run by scripts/test-pip.sh inside the minimal
# root filesystem (scripts/minimal-root.sh): nothing here but what the README's Python section
# lists, the Python brought in, and /work (this script, the sdist, the tests).
#   test-pip-inside.sh PYTHON KOKKOS_PREFIX RANKS...
# PYTHON: the Python >= 3.12 (mounted at its own path); KOKKOS_PREFIX: a Kokkos 4.6.01 prefix
# mounted read-only (the "named Kokkos" case); /wheelhouse: the wheels of torch and its
# dependencies (saves the 3 GB download; pip still resolves against PyPI); /sources: the Kokkos
# release archives (KVMAP_SOURCES), since this machine reaches no GitHub.
set -euo pipefail
py="$1" kokkos4="$2"
shift 2
ranks=("$@")
work=/work
log() { echo "[test-pip] $*"; }
pip_get=(--find-links /wheelhouse)

# The root holds what it held when it was built (scripts/minimal-root.sh), and none of what
# would hide a missing prerequisite: no CUDA toolkit, no system nlohmann/json.hpp, no CMake,
# ninja or ccache (pip brings its own CMake and ninja), no Debian Python or LibTorch.
if ! diff <(dpkg-query -W -f '${Package}\n' | sort) /.kvmap-packages >/dev/null; then
  log "the minimal root's packages changed since it was built:"
  diff <(dpkg-query -W -f '${Package}\n' | sort) /.kvmap-packages || true
  exit 1
fi
for p in nlohmann-json3-dev cmake ninja-build ccache libtorch-dev python3 nvidia-cuda-toolkit; do
  if dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    log "the minimal root holds $p, which the README does not list"; exit 1
  fi
done
for f in /usr/local/cuda /usr/include/nlohmann /usr/bin/nvcc /usr/bin/cmake /usr/bin/ccache; do
  if [ -e "$f" ]; then log "the minimal root holds $f, which the README does not list"; exit 1; fi
done
log "minimal root: $(wc -l </.kvmap-packages) Debian packages ($(cat /.kvmap-user-packages) and what they need), $("$py" --version)"

# The user's venv: Python, then what the README's Python section names (torch 2.14, Heat 1.9.0,
# mpi4py, numpy).
start=$(date +%s)
"$py" -m venv "$work/user-venv"
"$work/user-venv/bin/python" -m pip install -q "${pip_get[@]}" "torch>=2.14,<2.15" heat==1.9.0 \
  "mpi4py>=4" numpy >"$work/user-venv.log" 2>&1 || { tail -n 40 "$work/user-venv.log"; exit 1; }
log "user's venv (torch, Heat, mpi4py, numpy) in $(($(date +%s) - start)) s"

sdist="$(ls "$work"/dist/kvmap-*.tar.gz)"
log "pip wheel $(basename "$sdist") (no Kokkos named; KVMAP_SOURCES=$KVMAP_SOURCES; no compiler cache)"
start=$(date +%s)
"$work/user-venv/bin/python" -m pip wheel -v --no-deps "${pip_get[@]}" -w "$work/wheelhouse-out" "$sdist" \
  >"$work/wheel.log" 2>&1 || { tail -n 80 "$work/wheel.log"; exit 1; }
built=$(( $(date +%s) - start ))
grep -E -- "-- kvmap: (Kokkos|wheel RPATHs|LibTorch|nlohmann)" "$work/wheel.log" | sed 's/^ *-- /[test-pip]   /'
wheel="$(ls "$work"/wheelhouse-out/kvmap-*.whl)"
log "built $(basename "$wheel") in $built s: $(du -k "$wheel" | cut -f1) KiB"
mkdir -p "$work/keep" && mv "$wheel" "$work/keep/" && wheel="$work/keep/$(basename "$wheel")"

# A named Kokkos wins (an HPC site's, spack's): the same sdist with Kokkos_ROOT builds no
# Kokkos, ships none, and keeps that Kokkos' directory in its RPATH.
log "pip wheel with Kokkos_ROOT=$kokkos4"
start=$(date +%s)
Kokkos_ROOT="$kokkos4" "$work/user-venv/bin/python" -m pip wheel -v --no-deps "${pip_get[@]}" \
  -w "$work/named" "$sdist" >"$work/named.log" 2>&1 || { tail -n 80 "$work/named.log"; exit 1; }
if grep -q -- "-- kvmap: Kokkos 4.6.01 (OpenMP + Serial): configure" "$work/named.log" ||
   "$py" -m zipfile -l "$work"/named/kvmap-*.whl | grep -q "libkokkoscore"; then
  log "the wheel built with Kokkos_ROOT built or ships a Kokkos of its own"; exit 1
fi
mkdir -p "$work/named/x" && "$py" -m zipfile -e "$work"/named/kvmap-*.whl "$work/named/x"
readelf -d "$work"/named/x/kvmap/_kvmap*.so | grep -q "R[UN]*PATH.*$kokkos4/lib" ||
  { log "the extension does not find the named Kokkos:"; readelf -d "$work"/named/x/kvmap/_kvmap*.so | grep PATH; exit 1; }
log "  named Kokkos: used, not shipped, in the RPATH ($kokkos4/lib), built in $(($(date +%s) - start)) s"
rm -rf "$work/dist" "$work/wheelhouse-out" "$work/named" "$HOME/.cache/pip"

# Into the user's venv, as a Heat user installs it beside the torch and Heat they have (the
# build's own environment was pip's, and is gone).
venv="$work/user-venv"
log "pip install $(basename "$wheel")[heat,test] into the user's venv"
start=$(date +%s)
"$venv/bin/python" -m pip install -q "${pip_get[@]}" "$wheel[heat,test]" >"$work/install.log" 2>&1 ||
  { tail -n 60 "$work/install.log"; exit 1; }
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
log "installed in $(( $(date +%s) - start )) s: $(du -sk "$site/kvmap" | cut -f1) KiB in $site/kvmap"

# The tests only, outside any source tree: `import kvmap` can only find the installed one.
cd "$work/run"
"$venv/bin/python" -c 'import kvmap; print("[test-pip] import kvmap:", kvmap.__file__, kvmap.__version__)'
for np in "${ranks[@]}"; do
  log "pytest at $np rank(s)"
  start=$(date +%s)
  timeout 900 "$work/kvmap-mpiexec" -n "$np" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests \
    2>&1 | tee "$work/pytest-$np.log" | tail -n 3
  [ "${PIPESTATUS[0]}" = 0 ] || { log "pytest at $np rank(s) failed"; exit 1; }
  log "  $(grep -E "passed|failed" "$work/pytest-$np.log" | tail -n 1) ($(($(date +%s) - start)) s)"
done

# A Kokkos app built against the wheel's CMake package (its Kokkos, the venv's torch), with
# CMake and ninja from PyPI: a C++ consumer needs nothing beyond the README's list either.
log "C++: examples/particles against $site/kvmap/lib/cmake/kvmap (CMake and ninja from PyPI)"
"$venv/bin/python" -m pip install -q "${pip_get[@]}" cmake ninja >>"$work/install.log" 2>&1
PATH="$venv/bin:$PATH" cmake -S "$work/particles-src" -B "$work/particles" -G Ninja \
  -Dkvmap_DIR="$site/kvmap/lib/cmake/kvmap" >"$work/particles.log" 2>&1 &&
  PATH="$venv/bin:$PATH" cmake --build "$work/particles" >>"$work/particles.log" 2>&1 ||
  { tail -n 40 "$work/particles.log"; exit 1; }
grep -q "^Torch_DIR:PATH=$site/torch/" "$work/particles/CMakeCache.txt" ||
  { log "the particles app did not take the venv's torch:"; grep "^Torch_DIR" "$work/particles/CMakeCache.txt"; exit 1; }
timeout 300 "$work/kvmap-mpiexec" -n 2 "$work/particles/particles" | tail -n 3 | sed 's/^/[test-pip]   /'

log "pip uninstall"
"$venv/bin/python" -m pip uninstall -y -q kvmap
if "$venv/bin/python" -c 'import kvmap' 2>/dev/null; then
  log "kvmap is still importable after pip uninstall"; exit 1
fi
log "OK"
