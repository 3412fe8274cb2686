#!/usr/bin/env bash
# Installs kvmap from a build tree into a fresh prefix, builds examples/particles against
# that prefix alone, runs it under mpiexec -np 2 and checks its result against an
# independent computation; then imports the Python package from the prefix.
#   consume_install.sh <build dir> <source dir> <perf built: ON|OFF> [python]
set -euo pipefail
build="$1" src="$2" perf="$3" python="${4:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/installed" >/dev/null
# The package is relocatable: everything below uses the prefix after a move.
mv "$work/installed" "$work/prefix"
if [ "$perf" = ON ]; then
  version="$("$work/prefix/bin/kvmap-perf" --version)"
  echo "$version"
  grep -q "^kvmap $(sed -n 's/^project(kvmap VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt") " <<<"$version"
fi
# A copy of the example only: the build sees no kvmap source tree.
cp -r "$src/examples/particles" "$work/particles"
cmake -S "$work/particles" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build"
# A project that points at another Kokkos or another LibTorch is stopped with a clear message.
refused() {  # refused <what> <CMake variable> <expected message>
  mkdir -p "$work/other-$2"
  if cmake -S "$work/particles" -B "$work/build-other-$2" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
       "-D$2=$work/other-$2" >"$work/other-$2.log" 2>&1; then
    echo "consume_install: a different $1 was accepted"; exit 1
  fi
  grep -q "$3" "$work/other-$2.log" || { cat "$work/other-$2.log"; exit 1; }
  echo "consume_install: a different $1 is refused with a clear message"
}
refused Kokkos Kokkos_DIR "kvmap was built against Kokkos"
refused LibTorch Torch_DIR "kvmap was built against LibTorch"
# With Open MPI and MPICH side by side: the consumer gets kvmap's MPI (checked by the run
# below, which fails with two MPI libraries in one process), and a project that names the
# other one's wrapper is refused.
built_with="$(sed -n 's/^set(kvmap_MPI_CXX_COMPILER "\(.*\)")$/\1/p' "$work/prefix"/lib*/cmake/kvmap/kvmapConfig.cmake)"
other=""
for w in /usr/bin/mpicxx.openmpi /usr/bin/mpicxx.mpich; do
  if [ -x "$w" ] && [ "$(readlink -f "$w")" != "$(readlink -f "$built_with")" ]; then other="$w"; fi
done
if [ -n "$other" ]; then
  if cmake -S "$work/particles" -B "$work/build-other-mpi" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
       -DMPI_CXX_COMPILER="$other" >"$work/other-mpi.log" 2>&1; then
    echo "consume_install: another MPI ($other; kvmap's: $built_with) was accepted"; exit 1
  fi
  grep -q "kvmap was built against the MPI of" "$work/other-mpi.log" || { cat "$work/other-mpi.log"; exit 1; }
  echo "consume_install: another MPI ($other) is refused with a clear message"
fi
# The exported targets name LibTorch by its imported target, never by a library path of this
# machine, and carry the C++ standard kvmap was built with.
targets="$(cat "$work/prefix"/lib*/cmake/kvmap/kvmapTargets.cmake)"
if grep -Eq 'lib(c10|torch|torch_cpu)\.so' <<<"$targets"; then
  echo "consume_install: kvmapTargets.cmake names a LibTorch library file:"
  grep -E 'lib(c10|torch|torch_cpu)\.so' <<<"$targets"; exit 1
fi
std="$(grep -o 'cxx_std_[0-9]*' <<<"$targets" | head -n1)"
grep -q "^set(kvmap_CXX_STANDARD ${std#cxx_std_})" "$work/prefix"/lib*/cmake/kvmap/kvmapConfig.cmake \
  || { echo "consume_install: exported standard $std differs from the recorded one"; exit 1; }
n="${std#cxx_std_}"
flags="$(grep -o -- '-std=[a-z]*++[0-9a-z]*' "$work/build/build.ninja" | sort -u || true)"
if [ -z "$flags" ]; then
  # CMake adds no flag where the compiler's default already is that standard.
  default="$(c++ -dM -E -x c++ /dev/null | sed -n 's/^#define __cplusplus \([0-9]*\)L$/\1/p')"
  [ "$default" -ge "$([ "$n" = 20 ] && echo 202002 || echo 201703)" ] \
    || { echo "consume_install: the consumer compiles as C++ $default, not ${std}"; exit 1; }
  flags="(the compiler's default, __cplusplus $default)"
elif grep -qv -- "++$n\$" <<<"$flags"; then
  echo "consume_install: the consumer compiles with $flags, not ${std}"; exit 1
fi
echo "consume_install: the consumer compiles as ${std}, as kvmap was built: $flags"
out="$("$build/kvmap-mpiexec" -n 2 "$work/build/particles")"
echo "$out"
read -r n expected < <(/usr/bin/python3 "$src/tests/install/particles_reference.py" 2)
got="$(echo "$out" | sed -n 's/^total energy = //p')"
echo "$out" | grep -q "^particles: $n on 2 ranks" || { echo "particles: expected $n particles"; exit 1; }
/usr/bin/python3 - "$got" "$expected" <<'PY'
import sys
got, expected = float(sys.argv[1]), float(sys.argv[2])
if abs(got - expected) > 1e-9 * abs(expected):
    sys.exit("particles: total energy %r, independent reference %r" % (got, expected))
print("particles: matches the independent reference %.12f" % expected)
PY
echo "$out" | grep -q "bytes copied = 0"
if [ -n "$python" ]; then
  PYTHONPATH="$work/prefix/lib/python3/dist-packages" "$python" -c \
    "import kvmap; print('kvmap', kvmap.version(), 'imported from', kvmap.__file__)" | tee /dev/stderr | grep -q "$work/prefix"
fi
echo "consume_install: OK"
