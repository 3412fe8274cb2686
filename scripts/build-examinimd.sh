#!/usr/bin/env bash
# Builds ExaMiniMD (ECP-CoPA's Kokkos + MPI molecular-dynamics proxy app, BSD-3, commit
# 3264e29) with kvmap's force type (apps/examinimd) against kvmap installed from a build tree:
#   scripts/build-examinimd.sh <kvmap build dir> <output dir>
# Leaves <output dir>/bin/ExaMiniMD (its own main, `pair_style kvmap` registered) and
# <output dir>/bin/examinimd-kvmap (the checks and measurements driver). The source archive:
# $KVMAP_EXAMINIMD_SOURCE, else $KVMAP_SOURCES/ExaMiniMD-3264e29.tar.gz (default
# ../shared/third_party beside the checkout), checked against its sha256; else a git clone of
# the commit from GitHub, checked by its commit hash. None of ExaMiniMD's code is in kvmap:
# its tree is patched (apps/examinimd/examinimd-kvmap.patch) where it is built.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "$1" && pwd)"
out="$2"
commit=3264e29e28e7a5a4695a959c12df6bdf03bada34
archive_sha256=20a154a98e9eb38becbc6aaac81ca6f76fc285caa31d9d32d4938f7720a00873
mkdir -p "$out"
out="$(cd "$out" && pwd)"

tree="$out/ExaMiniMD-3264e29"
stamp="$out/source.stamp"
want_stamp="$commit $(sha256sum "$src/apps/examinimd/examinimd-kvmap.patch" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want_stamp" ]; then
  rm -rf "$tree"
  sources="${KVMAP_SOURCES:-$src/../shared/third_party}"
  archive="${KVMAP_EXAMINIMD_SOURCE:-$sources/ExaMiniMD-3264e29.tar.gz}"
  if [ -f "$archive" ]; then
    echo "$archive_sha256  $archive" | sha256sum --check --quiet - || {
      echo "build-examinimd: $archive does not have the sha256 of ExaMiniMD $commit" >&2
      exit 1
    }
    tar xzf "$archive" -C "$out"
  else
    echo "build-examinimd: no $archive; cloning github.com/ECP-copa/ExaMiniMD at $commit"
    git clone --quiet https://github.com/ECP-copa/ExaMiniMD.git "$tree"
    git -C "$tree" checkout --quiet "$commit"
    [ "$(git -C "$tree" rev-parse HEAD)" = "$commit" ] || {
      echo "build-examinimd: the clone is not at $commit" >&2
      exit 1
    }
  fi
  patch -d "$tree" -p1 --quiet < "$src/apps/examinimd/examinimd-kvmap.patch"
  echo "$want_stamp" > "$stamp"
fi

# kvmap as a user has it: installed into a prefix, found with find_package(kvmap).
cmake --install "$build" --prefix "$out/kvmap" > /dev/null
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$src/apps/examinimd" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$out/kvmap" -DEXAMINIMD_SOURCE_DIR="$tree" \
  -DCMAKE_INSTALL_PREFIX="$out" "${launcher[@]}" > /dev/null
cmake --build "$out/build"
cmake --install "$out/build" > /dev/null
echo "build-examinimd: $out/bin/ExaMiniMD and $out/bin/examinimd-kvmap"
