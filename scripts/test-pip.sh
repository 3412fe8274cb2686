#!/usr/bin/env bash
# What a Heat user does, on a machine with Python, torch, mpi4py and an MPI but no Kokkos:
#  1. pip builds kvmap's wheel from an sdist of a clean clone of HEAD (pip's build isolation)
#     with no Kokkos named and no kvmap dependency cache: Kokkos is built into the wheel
#     (from $KVMAP_SOURCES, default ../shared/third_party, where the sdist's build cannot look);
#  2. everything the build used goes (the clone, the sdist, pip's build tree, the cache);
#     the same sdist with Kokkos_ROOT builds a wheel that uses that Kokkos and ships none;
#  3. the wheel is installed with its dependencies ([heat,test]) into a new venv in another
#     directory, its ELF files' RPATHs are listed, and the Python tests run there (Heat's
#     interop included) from outside any source tree, at 1-4 ranks (no PYTHONPATH, no
#     LD_LIBRARY_PATH); then `pip uninstall`.
#   scripts/test-pip.sh [ranks...]     # default: 1 2 3 4
# Prints the wheel's size and the build and install times.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ranks=("$@")
[ "${#ranks[@]}" -gt 0 ] || ranks=(1 2 3 4)

# The torch wheel's venv builds the wheel (pip builds against the target environment's torch).
# (Kokkos 4.6.01 of the dependency cache: only for the wheel built with a named Kokkos.)
deps="$(KVMAP_TORCH2=1 KVMAP_KOKKOS4=1 "$KVMAP_SOURCE_DIR/scripts/install-deps.sh")"
py="$(sed -n 's/^torch2-python=//p' <<<"$deps")"
kokkos4="$(sed -n 's/^kokkos4=//p' <<<"$deps")"
export OMP_PROC_BIND="${OMP_PROC_BIND:-false}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
unset PYTHONPATH LD_LIBRARY_PATH
# No Kokkos named, no dependency cache: only the archives.
unset Kokkos_ROOT Kokkos_DIR KokkosKernels_ROOT KokkosKernels_DIR CMAKE_PREFIX_PATH KVMAP_DEPS_PREFIX
if [ -z "${KVMAP_SOURCES:-}" ] && [ -d "$KVMAP_SOURCE_DIR/../shared/third_party" ]; then
  export KVMAP_SOURCES="$(cd "$KVMAP_SOURCE_DIR/../shared/third_party" && pwd)"
fi
# pip's cache and the compiler cache stay where they are; the rest of the cache is empty.
PIP_CACHE_DIR="$("$py" -m pip cache dir)"
export PIP_CACHE_DIR
if command -v ccache >/dev/null 2>&1; then
  CCACHE_DIR="${CCACHE_DIR:-$(ccache -k cache_dir)}"
  export CCACHE_DIR KVMAP_ENABLE_CCACHE=ON CCACHE_BASEDIR=/ CCACHE_NOHASHDIR=true
fi

work="$(mktemp -d)"
venv="$work/elsewhere/venv"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
log() { echo "[test-pip] $*"; }
export XDG_CACHE_HOME="$work/cache"

# The MPI's launcher with its implementation's flags and environment (no build tree here).
cmake -DKVMAP_MPIEXEC_OUTPUT="$work/kvmap-mpiexec" -P "$KVMAP_SOURCE_DIR/cmake/KvmapMpiexec.cmake"

git clone -q "$KVMAP_SOURCE_DIR" "$work/src"
log "sdist of a clean clone of $(git -C "$work/src" rev-parse --short HEAD)"
"$py" -m pip install -q build
"$py" -m build --sdist --outdir "$work/dist" "$work/src" >"$work/sdist.log" 2>&1 || { cat "$work/sdist.log"; exit 1; }
sdist="$(ls "$work"/dist/kvmap-*.tar.gz)"
log "pip wheel $(basename "$sdist") (no Kokkos named; KVMAP_SOURCES=${KVMAP_SOURCES:-unset})"
start=$(date +%s)
"$py" -m pip wheel -v --no-deps -w "$work/wheelhouse" "$sdist" >"$work/wheel.log" 2>&1 ||
  { tail -n 80 "$work/wheel.log"; exit 1; }
built=$(( $(date +%s) - start ))
grep -E -- "-- kvmap: (Kokkos|wheel RPATHs)" "$work/wheel.log" | sed 's/^ *-- /[test-pip]   /'
wheel="$(ls "$work"/wheelhouse/kvmap-*.whl)"
log "built $(basename "$wheel") in $built s: $(du -k "$wheel" | cut -f1) KiB"
mkdir -p "$work/keep" && mv "$wheel" "$work/keep/" && wheel="$work/keep/$(basename "$wheel")"

# A named Kokkos wins (an HPC site's, spack's): the same sdist with Kokkos_ROOT builds no
# Kokkos, ships none, and keeps that Kokkos' directory in its RPATH.
log "pip wheel with Kokkos_ROOT=$kokkos4"
Kokkos_ROOT="$kokkos4" "$py" -m pip wheel -v --no-deps -w "$work/named" "$sdist" >"$work/named.log" 2>&1 ||
  { tail -n 80 "$work/named.log"; exit 1; }
if grep -q -- "-- kvmap: Kokkos 4.6.01 (OpenMP + Serial): configure" "$work/named.log" ||
   unzip -l "$work/named"/kvmap-*.whl | grep -q "libkokkoscore"; then
  log "the wheel built with Kokkos_ROOT built or ships a Kokkos of its own"; exit 1
fi
mkdir -p "$work/named/x" && (cd "$work/named/x" && unzip -q ../kvmap-*.whl)
readelf -d "$work"/named/x/kvmap/_kvmap*.so | grep -q "R[UN]*PATH.*$kokkos4/lib" ||
  { log "the extension does not find the named Kokkos:"; readelf -d "$work"/named/x/kvmap/_kvmap*.so | grep PATH; exit 1; }
log "  named Kokkos: used, not shipped, in the RPATH ($kokkos4/lib)"
rm -rf "$work/src" "$work/dist" "$work/wheelhouse" "$work/cache" "$work/named"

log "new venv $venv, pip install $(basename "$wheel")[heat,test]"
base="$("$py" -c 'import sys; print(sys._base_executable)')"
start=$(date +%s)
"$base" -m venv "$venv"
"$venv/bin/python" -m pip install -q "$wheel[heat,test]" >"$work/install.log" 2>&1 ||
  { tail -n 60 "$work/install.log"; exit 1; }
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
log "installed in $(( $(date +%s) - start )) s: $(du -sk "$site/kvmap" | cut -f1) KiB in $site/kvmap"
for f in "$site"/kvmap/_kvmap*.so "$site"/kvmap/lib/lib*.so*; do
  log "  RUNPATH ${f#"$site"/}: $(readelf -d "$f" | sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]/\1/p')"
done

# The tests only, outside any source tree: `import kvmap` can only find the installed one.
mkdir -p "$work/run"
cp -r "$KVMAP_SOURCE_DIR/bindings/python/tests" "$KVMAP_SOURCE_DIR/bindings/python/examples" "$work/run/"
cd "$work/run"
"$venv/bin/python" -c 'import kvmap; print("[test-pip] import kvmap:", kvmap.__file__, kvmap.__version__)'
for np in "${ranks[@]}"; do
  log "pytest at $np rank(s)"
  timeout 900 "$work/kvmap-mpiexec" -n "$np" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests
done
# A Kokkos app built against the wheel's CMake package (its Kokkos, the venv's torch).
log "C++: examples/particles against $site/kvmap/lib/cmake/kvmap"
cmake -S "$KVMAP_SOURCE_DIR/examples/particles" -B "$work/particles" -G Ninja \
  -Dkvmap_DIR="$site/kvmap/lib/cmake/kvmap" >"$work/particles.log" 2>&1 &&
  cmake --build "$work/particles" >>"$work/particles.log" 2>&1 ||
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
