# shellcheck shell=bash
# Shared by loom's scripts: installs what is missing, configures build trees, lists the sources.
# Usage: source scripts/lib.sh, then
#   loom_configure [cmake args]                  configure $LOOM_BUILD_DIR (default build/)
#   loom_configure_dir <build-dir> [cmake args]  configure <build-dir>
#   loom_cxx_sources                             the tracked C++ files, NUL-separated
# Both configure with Ninja, Release, -DLOOM_WERROR=ON, ccache when present, and the C++
# compiler $LOOM_CXX (else $CXX, else CMake's default).
set -euo pipefail
LOOM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOOM_BUILD_DIR=${LOOM_BUILD_DIR:-$LOOM_ROOT/build}
JOBS=${JOBS:-$(nproc)}

# Installs what is missing (scripts/deps.sh), once per shell; exports LOOM_VENV.
loom_deps() {
  if [ -z "${_loom_deps_done:-}" ]; then
    LOOM_VENV=$(bash "$LOOM_ROOT/scripts/deps.sh" | tail -n 1)
    export LOOM_VENV
    _loom_deps_done=1
  fi
}

loom_configure_dir() {
  local dir=$1
  shift
  loom_deps
  local args=()
  if command -v ccache >/dev/null 2>&1; then
    args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    # Paths below the checkout are hashed relative to it, so a fresh clone in another folder
    # (as CI makes) reuses the compiler cache of the last one.
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$LOOM_ROOT}
    export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
    # What ccache needs to cache translation units built on a precompiled header (the header
    # tests, cmake/LoomTesting.cmake) instead of compiling them every time.
    export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  fi
  local cxx=${LOOM_CXX:-${CXX:-}}
  if [ -n "$cxx" ]; then
    # An absolute path, so that the next configure sees the same compiler and keeps the cache.
    local path
    path=$(command -v "$cxx") || { echo "[loom] C++ compiler $cxx not found" >&2; return 1; }
    args+=(-DCMAKE_CXX_COMPILER="$path")
  fi
  mkdir -p "$(dirname "$dir")"
  cmake -S "$LOOM_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLOOM_WERROR=ON "${args[@]}" "$@" >"$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log"
    echo "[loom] configuring $dir failed" >&2
    return 1
  }
  local compiler
  compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$dir/CMakeCache.txt" 2>/dev/null || true)
  echo "[loom] configured $dir with $compiler (LibTorch from $LOOM_VENV)" >&2
}

loom_configure() {
  loom_configure_dir "$LOOM_BUILD_DIR" "$@"
}

# Every tracked *.hpp, *.cpp and *.h under include/ tests/ examples/ benchmarks/ src/ that exists
# in the working tree, relative to the repository root (what scripts/format.sh formats).
loom_cxx_sources() {
  local f
  while IFS= read -r -d '' f; do
    case "$f" in
      *.hpp | *.cpp | *.h)
        if [ -f "$LOOM_ROOT/$f" ]; then printf '%s\0' "$f"; fi ;;
    esac
  done < <(git -C "$LOOM_ROOT" ls-files -z -- include tests examples benchmarks src)
}
