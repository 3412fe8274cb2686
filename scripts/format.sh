#!/usr/bin/env bash
# Formats kvmap's C++ sources with clang-format (.clang-format), or checks them.
#   scripts/format.sh            rewrite every tracked *.cpp/*.hpp in place
#   scripts/format.sh --check    list the files that are not formatted; exit 1 if any
#   scripts/format.sh --tidy [BUILD_DIR]
#                                run clang-tidy (.clang-tidy) on kvmap's own sources, using
#                                BUILD_DIR/compile_commands.json (default: build/default)
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format}"
mapfile -t files < <(git ls-files '*.cpp' '*.hpp')

case "${1:-}" in
  --check)
    bad=()
    for f in "${files[@]}"; do
      if ! "$CLANG_FORMAT" --style=file "$f" | cmp -s - "$f"; then bad+=("$f"); fi
    done
    if ((${#bad[@]})); then
      printf 'not formatted (run scripts/format.sh):\n' >&2
      printf '  %s\n' "${bad[@]}" >&2
      exit 1
    fi
    echo "format: ${#files[@]} files formatted ($("$CLANG_FORMAT" --version | head -n1))"
    ;;
  --tidy)
    build="${2:-build/default}"
    mapfile -t sources < <(git ls-files 'runtime/src/*.cpp' 'bindings/python/src/*.cpp' 'perf/*.cpp' 'examples/*.cpp')
    clang-tidy -p "$build" --quiet "${sources[@]}"
    ;;
  "")
    "$CLANG_FORMAT" --style=file -i "${files[@]}"
    ;;
  *)
    echo "usage: scripts/format.sh [--check | --tidy [BUILD_DIR]]" >&2
    exit 2
    ;;
esac
