#!/usr/bin/env bash
# Formats the files scripts/check-format.sh checks, in place, with clang-format-14 and
# .clang-format.   CLANG_FORMAT  the clang-format to run (default clang-format-14)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cf=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "format: $cf not found (scripts/deps.sh installs it)" >&2
  exit 2
fi
cd "$LOOM_ROOT" || exit 1
loom_cxx_sources | xargs -0 -r "$cf" --style=file -i
echo "format: $(loom_cxx_sources | tr -cd '\0' | wc -c) files formatted" >&2
