#!/usr/bin/env bash
# One LibTorch per process: libkvmap and the Python extension resolve libc10, libtorch_cpu
# and libtorch (where needed) to exactly one file each, all in the directory of the LibTorch kvmap was
# configured with; a Python process that imports kvmap maps exactly one libc10.
#   one_libtorch.sh <torch lib dir> <libkvmap> [<python extension> <python> <PYTHONPATH>]
set -euo pipefail
torch_libdir="$(realpath "$1")"
status=0
check_closure() {
  local file="$1" lib paths n
  for lib in libc10.so libtorch_cpu.so libtorch.so; do
    paths="$(ldd "$file" | awk -v l="$lib" 'index($1, l) == 1 && ($1 == l || substr($1, length(l) + 1, 1) == ".") { print $3 }' | xargs -r -n1 realpath | sort -u)"
    n="$(grep -c . <<<"$paths" || true)"
    # libtorch itself may be dropped by --as-needed (kvmap calls into c10 and torch_cpu).
    if [ "$n" = 0 ] && [ "$lib" = libtorch.so ]; then
      echo "one_libtorch: $(basename "$file"): $lib not needed"
    elif [ "$n" != 1 ]; then
      echo "one_libtorch: $(basename "$file") resolves $lib to $n files: $paths"; status=1
    elif [ "$(dirname "$paths")" != "$torch_libdir" ]; then
      echo "one_libtorch: $(basename "$file") resolves $lib to $paths, not in $torch_libdir"; status=1
    else
      echo "one_libtorch: $(basename "$file"): $lib -> $paths"
    fi
  done
}
check_closure "$2"
if [ $# -ge 5 ]; then
  check_closure "$3"
  mapped="$(PYTHONPATH="$5" "$4" -c '
import kvmap, os
paths = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        path = line.split()[-1]
        if os.path.basename(path).startswith("libc10.so"):
            paths.add(os.path.realpath(path))
print("\n".join("mapped " + p for p in sorted(paths)))' | sed -n 's/^mapped //p')"
  n="$(grep -c . <<<"$mapped" || true)"
  if [ "$n" != 1 ] || [ "$(dirname "$mapped")" != "$torch_libdir" ]; then
    echo "one_libtorch: a Python process with kvmap imported maps $n libc10: $mapped"; status=1
  else
    echo "one_libtorch: import kvmap maps one libc10: $mapped"
  fi
fi
[ "$status" = 0 ] && echo "one_libtorch: OK"
exit "$status"
