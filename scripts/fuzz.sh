#!/usr/bin/env bash
# Fuzzes loom's checkpoint reader: builds tests/fuzz/checkpoint_fuzz.cpp with Clang 14,
# libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer (target loom_checkpoint_fuzz of
# the Clang build tree, $LOOM_BUILD_DIR-clang), seeds it with real torch.save files
# (tests/fuzz/make_seeds.py, stock torch) and runs it for SECONDS seconds (default 60) on both
# cores. Exits non-zero on a finding (the crashing input is left in $LOOM_BUILD_DIR-fuzz/) and
# when the jobs' logs report no execution at all (a fuzzer that did not run is no pass).
#   bash scripts/fuzz.sh [SECONDS] [extra libFuzzer flags]
#   LOOM_CLANG  the Clang to build with (default clang++-14)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
seconds=${1:-60}
shift || true
dir=$LOOM_BUILD_DIR-clang
work=$LOOM_BUILD_DIR-fuzz
if [ ! -f "$dir/CMakeCache.txt" ]; then
  LOOM_CXX=${LOOM_CLANG:-clang++-14} loom_configure_dir "$dir"
else
  loom_deps
fi
cmake --build "$dir" --target loom_checkpoint_fuzz -j "$JOBS" >"$work.build.log" 2>&1 || {
  cat "$work.build.log"
  echo "[loom] fuzz: building loom_checkpoint_fuzz failed" >&2
  exit 1
}
mkdir -p "$work/seeds" "$work/corpus"
rm -f "$work"/fuzz*.log "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*
"$LOOM_VENV/bin/python" "$LOOM_ROOT/tests/fuzz/make_seeds.py" "$work/seeds" >&2
cd "$work"
# LibTorch keeps static allocations to the end of the process: leak checks would report those.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
start=$SECONDS
"$dir/tests/loom_checkpoint_fuzz" corpus seeds -max_total_time="$seconds" -rss_limit_mb=4096 \
  -max_len=65536 -print_final_stats=1 -jobs="$JOBS" -workers="$JOBS" "$@" \
  >fuzz.log 2>&1 || status=$?
elapsed=$((SECONDS - start))
grep -h -E "ERROR|SUMMARY" fuzz*.log 2>/dev/null | sort | uniq -c | sed 's/^/[loom] fuzz: /' >&2 ||
  true
# Each job's final stats are in its own fuzz-N.log (fuzz.log repeats them). No log, or no stats
# line, is 0 executions (checked below), not an exit here through pipefail.
execs=$({ grep -h "stat::number_of_executed_units" fuzz-*.log 2>/dev/null || true; } |
          awk '{s += $2} END {print s + 0}')
if [ "${status:-0}" != 0 ] || ls crash-* leak-* timeout-* oom-* >/dev/null 2>&1; then
  echo "[loom] fuzz: FINDINGS after $execs executions in $elapsed s (inputs in $work;" \
    "logs fuzz*.log)" >&2
  exit 1
fi
if [ "$execs" = 0 ]; then
  tail -n 20 fuzz.log >&2 2>/dev/null || true
  echo "[loom] fuzz: FAILED: no executions reported (no stat::number_of_executed_units in" \
    "$work/fuzz-*.log) after $elapsed s: the fuzzer did not run" >&2
  exit 1
fi
echo "[loom] fuzz: ok, $execs executions in $elapsed s (limit $seconds s), no findings"
