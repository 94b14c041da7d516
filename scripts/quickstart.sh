#!/usr/bin/env bash
# Installs what is missing, builds the quick-start example and trains it on Fashion-MNIST.
# Extra arguments go to the example (e.g. --epochs 2).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
loom_configure
cmake --build "$LOOM_BUILD_DIR" --target loom_quickstart -j "$JOBS"
"$LOOM_BUILD_DIR/examples/quickstart" --data "$LOOM_BUILD_DIR/data/fashion-mnist" "$@"
