#!/usr/bin/env bash
# The API reference: Doxygen over the installed public headers (docs/Doxyfile) into
# build/docs/html. Any Doxygen warning fails it, an undocumented public name among them.
# Installs Debian's doxygen when it is missing (install-deps.sh, KVMAP_DOCS=1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v doxygen >/dev/null 2>&1; then
  KVMAP_DOCS=1 scripts/install-deps.sh >/dev/null
fi
out="${KVMAP_DOCS_OUT:-build/docs}"
rm -rf "$out" && mkdir -p "$out"
KVMAP_DOCS_OUT="$out" doxygen docs/Doxyfile
echo "[kvmap] API reference: $out/html/index.html ($(doxygen --version), no warnings)"
