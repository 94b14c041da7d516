#!/usr/bin/env bash
# Installs what loom needs and is missing; safe to run again (each step checks first).
#   OS packages: cmake, ninja, g++, clang-14 (the second compiler), clang-format, ccache,
#                Catch2 2.x, Boost 1.81 (Hana), CLI11 (the examples' command lines), Google
#                Benchmark, Doxygen (the API reference), Fashion-MNIST (the quick-start example),
#                libdeflate (checkpoint CRC-32s), Protobuf (TensorBoard event files),
#                nlohmann/json (safetensors headers).
#   Python:      a virtual environment with the pinned torch wheel, outside the repository,
#                at $LOOM_VENV (default $LOOM_HOME/torch-<version>, LOOM_HOME=$HOME/.cache/loom),
#                and the pinned tensorboard, which the logger tests read event files with, and
#                matplotlib, which scripts/plot_metrics.py draws with (test
#                example.quickstart.metrics.plot), and safetensors, Hugging Face's reader and
#                writer, a parity peer of loom's (test checkpoint.safetensors.python).
# Prints the virtual environment's path on its last line.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
LOOM_HOME=${LOOM_HOME:-$HOME/.cache/loom}
LOOM_VENV=${LOOM_VENV:-$LOOM_HOME/torch-$LOOM_TORCH_VERSION}

log() { echo "[loom deps] $*" >&2; }

os_packages=(cmake ninja-build g++ clang-14 libclang-rt-14-dev clang-format-14 ccache gzip python3-venv
             catch2 libboost1.81-dev libcli11-dev libgloo-dev libbenchmark-dev libdeflate-dev doxygen
             libprotobuf-dev protobuf-compiler nlohmann-json3-dev
             dataset-fashion-mnist)
missing=()
for p in "${os_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3-venv only matters when the python3 on PATH is Debian's own.
if [ ${#missing[@]} -gt 0 ] && [ "$(printf '%s\n' "${missing[@]}")" = python3-venv ] \
   && python3 -c 'import venv, ensurepip' 2>/dev/null; then
  missing=()
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing OS packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "OS packages present"
fi

want="$LOOM_TORCH_VERSION"
have=$("$LOOM_VENV/bin/python" -c 'import torch, sys; sys.stdout.write(torch.__version__.split("+")[0])' \
         2>/dev/null || true)
if [ "$have" != "$want" ]; then
  log "installing torch==$want into $LOOM_VENV (about 5 GiB with its CUDA libraries)"
  mkdir -p "$(dirname "$LOOM_VENV")"
  [ -x "$LOOM_VENV/bin/python" ] || python3 -m venv "$LOOM_VENV"
  "$LOOM_VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$want" numpy
else
  log "torch $have present in $LOOM_VENV"
fi
# pinned <module> <version> <why>: pip-installs <module>==<version> unless that version is there.
pinned() {
  local have
  have=$("$LOOM_VENV/bin/python" -c "import $1, sys; sys.stdout.write($1.__version__)" \
           2>/dev/null || true)
  if [ "$have" != "$2" ]; then
    log "installing $1==$2 into $LOOM_VENV ($3)"
    "$LOOM_VENV/bin/python" -m pip install -q --disable-pip-version-check "$1==$2"
  fi
}
pinned tensorboard "$LOOM_TENSORBOARD_VERSION" "the logger tests' reader"
pinned matplotlib "$LOOM_MATPLOTLIB_VERSION" "the metrics plot and its test"
pinned safetensors "$LOOM_SAFETENSORS_VERSION" "the safetensors parity test"
echo "$LOOM_VENV"
