#!/usr/bin/env bash
# What a Heat user does: `pip install` kvmap (from an sdist of a clean clone of HEAD, with
# pip's build isolation) into the torch2 venv, then the Python tests (Heat's interop and
# vmap cases included) from a directory outside the source tree, against the installed
# package (no PYTHONPATH, no LD_LIBRARY_PATH) at 1-4 ranks; then `pip uninstall`.
#   scripts/test-pip.sh [ranks...]     # default: 1 2 3 4
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ranks=("$@")
[ "${#ranks[@]}" -gt 0 ] || ranks=(1 2 3 4)

# The modern configuration's Kokkos (4.6.01) and torch wheel.
deps="$(KVMAP_TORCH2=1 KVMAP_KOKKOS4=1 "$KVMAP_SOURCE_DIR/scripts/install-deps.sh")"
py="$(sed -n 's/^torch2-python=//p' <<<"$deps")"
export Kokkos_ROOT="$(sed -n 's/^kokkos4=//p' <<<"$deps")"
export OMP_PROC_BIND="${OMP_PROC_BIND:-false}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
unset PYTHONPATH LD_LIBRARY_PATH
# The compiler cache serves the wheel's build too (the sdist unpacks under a new name).
if command -v ccache >/dev/null 2>&1; then export KVMAP_ENABLE_CCACHE=ON CCACHE_BASEDIR=/ CCACHE_NOHASHDIR=true; fi

work="$(mktemp -d)"
cleanup() {
  "$py" -m pip uninstall -y -q kvmap >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "[test-pip] $*"; }

# The MPI's launcher with its implementation's flags and environment (no build tree here).
cmake -DKVMAP_MPIEXEC_OUTPUT="$work/kvmap-mpiexec" -P "$KVMAP_SOURCE_DIR/cmake/KvmapMpiexec.cmake"

git clone -q "$KVMAP_SOURCE_DIR" "$work/src"
log "sdist of a clean clone of $(git -C "$work/src" rev-parse --short HEAD)"
"$py" -m pip install -q build
"$py" -m build --sdist --outdir "$work/dist" "$work/src" >"$work/sdist.log" 2>&1 || { cat "$work/sdist.log"; exit 1; }
sdist="$(ls "$work"/dist/kvmap-*.tar.gz)"
log "pip install $(basename "$sdist") (Kokkos_ROOT=$Kokkos_ROOT)"
start=$(date +%s)
"$py" -m pip install "$sdist" >"$work/install.log" 2>&1 || { tail -n 60 "$work/install.log"; exit 1; }
log "installed in $(( $(date +%s) - start )) s: $("$py" -m pip show kvmap | sed -n 's/^Location: //p')"

# The tests only, outside the source tree: `import kvmap` can only find the installed one.
mkdir -p "$work/run"
cp -r "$KVMAP_SOURCE_DIR/bindings/python/tests" "$KVMAP_SOURCE_DIR/bindings/python/examples" "$work/run/"
cd "$work/run"
"$py" -c 'import kvmap, sys; print("[test-pip] import kvmap:", kvmap.__file__, kvmap.__version__)'
for np in "${ranks[@]}"; do
  log "pytest at $np rank(s)"
  timeout 900 "$work/kvmap-mpiexec" -n "$np" "$py" -m pytest -q -p no:cacheprovider tests
done
log "pip uninstall"
"$py" -m pip uninstall -y -q kvmap
if "$py" -c 'import kvmap' 2>/dev/null; then
  log "kvmap is still importable after pip uninstall"; exit 1
fi
log "OK"
