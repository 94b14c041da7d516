#!/usr/bin/env bash
# Builds loom's API reference with Doxygen (docs/Doxyfile): the headers under include/loom,
# the pages under docs/ and README.md as the main page, as HTML.
#
#   scripts/docs.sh [output-dir]        (default build/docs/api; open <output-dir>/index.html)
#
# Fails (exit status 1) on any Doxygen warning and prints the warnings; they are also kept in
# <output-dir>/doxygen-warnings.log. Needs Doxygen 1.9 or newer (Debian: apt-get install
# doxygen; scripts/deps.sh installs it).   DOXYGEN  the doxygen to run (default: doxygen)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/build/docs/api}
doxygen=${DOXYGEN:-doxygen}
command -v "$doxygen" >/dev/null 2>&1 || { echo "docs.sh: $doxygen not found" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(sed -nE 's/^project\(loom VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
cd "$root"
status=0
LOOM_DOCS_OUT="$out" LOOM_VERSION="$version" "$doxygen" docs/Doxyfile || status=$?
log="$out/doxygen-warnings.log"
if [ "$status" != 0 ] || [ -s "$log" ]; then
  [ -s "$log" ] && cat "$log" >&2
  echo "docs.sh: doxygen reported warnings (above); the reference is in $out" >&2
  exit 1
fi
echo "docs.sh: API reference in $out/index.html"
