#!/usr/bin/env bash
# Fails, listing them, when tracked C++ files (*.hpp, *.cpp, *.h under include/ tests/ examples/
# benchmarks/ src/) differ from what clang-format-14 makes of them with .clang-format.
# scripts/format.sh formats them.   CLANG_FORMAT  the clang-format to run (default clang-format-14)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cf=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "check-format: $cf not found (scripts/deps.sh installs it)" >&2
  exit 2
fi
mapfile -d '' files < <(loom_cxx_sources)
bad=()
for f in "${files[@]}"; do
  "$cf" --style=file --dry-run --Werror "$LOOM_ROOT/$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} of ${#files[@]} files differ from .clang-format" \
       "(scripts/format.sh formats them):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted" >&2
