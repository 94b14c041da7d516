#!/usr/bin/env bash
# Packs the third-party headers loom's GPU check needs into one folder that can travel with the
# working tree to a machine with a GPU but no OS packages and no network:
#   <dir>/catch2/catch.hpp                          Catch2 2.x single header
#   <dir>/cmake/Catch.cmake, CatchAddTests.cmake    catch_discover_tests
#   <dir>/boost/hana.hpp, boost/hana/...            Boost.Hana, and the few Boost headers it
#                                                   includes (found with the compiler's -M)
#   <dir>/gloo/...                                  gloo's headers, for loom::dist (headers only)
#   <dir>/CLI/...                                   CLI11 (header-only), for the DDP benchmark
#   <dir>/libdeflate.h, <dir>/lib/libdeflate.so*    libdeflate, the checkpoints' CRC-32 (else
#                                                   loom falls back to zlib or its own)
# Usage: scripts/pack-gpu-deps.sh [dir]   (default build-gpu-deps, git-ignored; prints the dir)
# Then: LOOM_THIRD_PARTY=<dir> scripts/gpu-check.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$root/build-gpu-deps}
inc=${LOOM_SYSTEM_INCLUDE:-/usr/include}
catch_cmake=${LOOM_CATCH_CMAKE_DIR:-}
if [ -z "$catch_cmake" ]; then
  for d in /usr/lib/cmake/Catch2 /usr/share/cmake/Catch2 /usr/local/lib/cmake/Catch2 \
           /usr/lib/x86_64-linux-gnu/cmake/Catch2; do
    [ -f "$d/Catch.cmake" ] && { catch_cmake=$d; break; }
  done
fi
[ -f "$inc/catch2/catch.hpp" ] || { echo "pack-gpu-deps: no $inc/catch2/catch.hpp" >&2; exit 1; }
[ -f "$inc/boost/hana.hpp" ] || { echo "pack-gpu-deps: no $inc/boost/hana.hpp" >&2; exit 1; }
[ -n "$catch_cmake" ] || { echo "pack-gpu-deps: no Catch.cmake found" >&2; exit 1; }

rm -rf "$dest"
mkdir -p "$dest/catch2" "$dest/cmake" "$dest/boost"
cp "$inc/catch2/catch.hpp" "$dest/catch2/"
cp "$catch_cmake/Catch.cmake" "$catch_cmake/CatchAddTests.cmake" "$dest/cmake/"
cp -r "$inc/boost/hana" "$inc/boost/hana.hpp" "$dest/boost/"
# Every other Boost header that Hana (all of it, as boost/hana.hpp includes it) pulls in.
printf '#include <boost/hana.hpp>\n' |
  ${CXX:-c++} -std=c++20 -M -x c++ - -o - 2>/dev/null | tr ' \\' '\n\n' |
  { grep -E "^$inc/boost/" || true; } | { grep -v "^$inc/boost/hana" || true; } | sort -u |
  while read -r f; do
    rel=${f#"$inc"/}
    mkdir -p "$dest/$(dirname "$rel")"
    cp "$f" "$dest/$rel"
  done
if [ -f "$inc/gloo/algorithm.h" ]; then
  cp -r "$inc/gloo" "$dest/"
else
  echo "pack-gpu-deps: no $inc/gloo (libgloo-dev): the GPU check will build without loom::dist" >&2
fi
if [ -f "$inc/CLI/CLI.hpp" ]; then
  cp -r "$inc/CLI" "$dest/"
else
  echo "pack-gpu-deps: no $inc/CLI (libcli11-dev): the GPU check will not run the DDP benchmark" >&2
fi
libdeflate_so=$(ls /usr/lib/*/libdeflate.so.0 /usr/lib/libdeflate.so.0 2>/dev/null | head -1 || true)
if [ -f "$inc/libdeflate.h" ] && [ -n "$libdeflate_so" ]; then
  mkdir -p "$dest/lib"
  cp "$inc/libdeflate.h" "$dest/"
  cp -L "$libdeflate_so" "$dest/lib/libdeflate.so.0"
  cp "$dest/lib/libdeflate.so.0" "$dest/lib/libdeflate.so"  # a file: links may not travel
else
  echo "pack-gpu-deps: no libdeflate (libdeflate-dev): checkpoints' CRC-32 from zlib or loom's own" >&2
fi
echo "pack-gpu-deps: $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1)" >&2
echo "$dest"
