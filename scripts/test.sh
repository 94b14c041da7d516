#!/usr/bin/env bash
# Installs what is missing, builds loom's tests and examples, and runs the whole CPU suite
# through ctest (tests labelled gpu need a GPU and are left out).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
loom_configure
cmake --build "$LOOM_BUILD_DIR" -j "$JOBS"
ctest --test-dir "$LOOM_BUILD_DIR" --output-on-failure -j "$JOBS" -LE gpu "$@"
