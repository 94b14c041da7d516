# Shared by loom's scripts: installs what is missing, then configures the build tree.
# Usage: source scripts/lib.sh; loom_configure
set -euo pipefail
LOOM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOOM_BUILD_DIR=${LOOM_BUILD_DIR:-$LOOM_ROOT/build}
JOBS=${JOBS:-$(nproc)}

loom_configure() {
  LOOM_VENV=$(bash "$LOOM_ROOT/scripts/deps.sh" | tail -n 1)
  export LOOM_VENV
  local launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    # Paths below the checkout are hashed relative to it, so a fresh clone in another folder
    # (as CI makes) reuses the compiler cache of the last one.
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$LOOM_ROOT}
    export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  fi
  cmake -S "$LOOM_ROOT" -B "$LOOM_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLOOM_WERROR=ON "${launcher[@]}" "$@" >"$LOOM_BUILD_DIR.configure.log" 2>&1 || {
    cat "$LOOM_BUILD_DIR.configure.log"
    echo "[loom] configuring failed" >&2
    return 1
  }
  echo "[loom] configured $LOOM_BUILD_DIR (LibTorch from $LOOM_VENV)" >&2
}
