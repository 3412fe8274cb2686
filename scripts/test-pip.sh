#!/usr/bin/env bash
# What a Heat user does, on a machine that holds only what the README's Python section lists:
# a minimal Debian root filesystem (scripts/minimal-root.sh: debootstrap minbase + a C++
# compiler, Open MPI with its headers, CA certificates; no CUDA toolkit, no CMake, no
# nlohmann-json, none of install-deps.sh's packages, no kvmap cache) with a Python >= 3.12
# brought in. Inside it (scripts/test-pip-inside.sh):
#  1. the user's venv gets torch 2.14, Heat 1.9.0, mpi4py and numpy from PyPI;
#  2. pip builds kvmap's wheel from an sdist of a clean clone of HEAD (pip's build isolation;
#     its CMake, ninja and nlohmann-json from PyPI) with no Kokkos named: Kokkos is built into
#     the wheel from the release archives; the same sdist with Kokkos_ROOT builds a wheel that
#     uses that Kokkos and ships none;
#  3. everything the build used goes; the wheel is installed with [heat,test] into the user's
#     venv; the Python tests run there from outside any source tree at 1-4 ranks (no
#     PYTHONPATH, no LD_LIBRARY_PATH); a Kokkos app is built against the wheel's CMake
#     package; then `pip uninstall`.
# Needs root (chroot, mounts; scripts/minimal-root.sh).
#   scripts/test-pip.sh [ranks...]     # default: 1 2 3 4
# Prints the steps' times, the wheel's size and the test counts.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ranks=("$@")
[ "${#ranks[@]}" -gt 0 ] || ranks=(1 2 3 4)
log() { echo "[test-pip] $*"; }
if [ "$(id -u)" -ne 0 ]; then
  log "the pip test builds in a minimal root filesystem (chroot): run it as root"; exit 1
fi
t0=$(date +%s)

# From the machine (outside the root): the Python the user brings, the wheels of the torch2
# venv (so that the 3 GB torch download is not repeated), a Kokkos 4.6.01 to name, the Kokkos
# release archives, git and CMake for the clean clone, the sdist and the MPI launcher script.
deps="$(KVMAP_TORCH2=1 KVMAP_KOKKOS4=1 "$KVMAP_SOURCE_DIR/scripts/install-deps.sh")"
py="$(sed -n 's/^torch2-python=//p' <<<"$deps")"
wheelhouse="$(sed -n 's/^wheelhouse=//p' <<<"$deps")"
kokkos4="$(sed -n 's/^kokkos4=//p' <<<"$deps")"
sources="${KVMAP_SOURCES:-$KVMAP_SOURCE_DIR/../shared/third_party}"
[ -d "$sources" ] || { log "no Kokkos release archives: set KVMAP_SOURCES"; exit 1; }
sources="$(cd "$sources" && pwd)"
base_prefix="$("$py" -c 'import sys; print(sys.base_prefix)')"
base_python="$("$py" -c 'import os, sys; print(os.path.realpath(sys._base_executable))')"
t_deps=$(($(date +%s) - t0))

t1=$(date +%s)
root="$("$KVMAP_SOURCE_DIR/scripts/minimal-root.sh")"
t_root=$(($(date +%s) - t1))

work="$root/work"
rm -rf "$work" && mkdir -p "$work/run"
git clone -q "$KVMAP_SOURCE_DIR" "$work/src"
log "sdist of a clean clone of $(git -C "$work/src" rev-parse --short HEAD)"
"$py" -m pip install -q build
"$py" -m build --sdist --outdir "$work/dist" "$work/src" >"$work/sdist.log" 2>&1 || { cat "$work/sdist.log"; exit 1; }
cp "$work/src/scripts/test-pip-inside.sh" "$work/"
cp -r "$work/src/bindings/python/tests" "$work/src/bindings/python/examples" "$work/run/"
cp -r "$work/src/examples/particles" "$work/particles-src"
# The MPI's launcher with its implementation's flags and environment, as the root will run it
# (the same Debian Open MPI paths inside).
cmake -DKVMAP_MPIEXEC_OUTPUT="$work/kvmap-mpiexec" -P "$KVMAP_SOURCE_DIR/cmake/KvmapMpiexec.cmake"
rm -rf "$work/src"

# Inside: a private mount namespace (the mounts end with it), the root's own /proc, /sys and
# /dev, and read-only: the Python, the wheelhouse, the archives and the named Kokkos.
inner_env=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
  TERM=dumb SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 KVMAP_SOURCES=/sources
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OMP_PROC_BIND=false OMP_WAIT_POLICY=PASSIVE)
t2=$(date +%s)
unshare --mount --propagation private bash -euo pipefail -c '
  root="$1" base_prefix="$2" wheelhouse="$3" sources="$4" kokkos4="$5"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  ro_bind() { mkdir -p "$root$2"; mount --bind "$1" "$root$2"; mount -o remount,bind,ro "$root$2"; }
  ro_bind "$base_prefix" "$base_prefix"
  ro_bind "$wheelhouse" /wheelhouse
  ro_bind "$sources" /sources
  ro_bind "$kokkos4" "$kokkos4"
  shift 5
  exec chroot "$root" "$@"
' bash "$root" "$base_prefix" "$wheelhouse" "$sources" "$kokkos4" \
  env -i "${inner_env[@]}" bash /work/test-pip-inside.sh "$base_python" "$kokkos4" "${ranks[@]}"
t_inside=$(($(date +%s) - t2))
rm -rf "$work"
log "times: dependencies $t_deps s, minimal root $t_root s, inside $t_inside s, total $(($(date +%s) - t0)) s"
