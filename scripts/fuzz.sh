#!/usr/bin/env bash
# Fuzzes loom's readers of files others write: the checkpoint reader
# (tests/fuzz/checkpoint_fuzz.cpp, seeded with real torch.save files: tests/fuzz/make_seeds.py),
# the safetensors reader (tests/fuzz/safetensors_fuzz.cpp, seeded with files Python's
# safetensors wrote: tests/fuzz/make_safetensors_seeds.py) and the DCP metadata reader
# (tests/fuzz/dcp_fuzz.cpp, seeded with `.metadata` files Python's torch.distributed.checkpoint
# wrote: tests/fuzz/make_dcp_seeds.py), each built with Clang 14, libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer (targets loom_checkpoint_fuzz,
# loom_safetensors_fuzz and loom_dcp_fuzz of the Clang build tree, $LOOM_BUILD_DIR-clang) and
# run for SECONDS
# seconds (default 60) on both cores, one after the other. Exits non-zero on a finding (the
# crashing input is left in $LOOM_BUILD_DIR-fuzz/NAME/) and when a fuzzer's logs report no
# execution at all (a fuzzer that did not run is no pass).
#   bash scripts/fuzz.sh [SECONDS] [extra libFuzzer flags]
#   LOOM_CLANG  the Clang to build with (default clang++-14)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
seconds=${1:-60}
shift || true
extra=("$@")  # libFuzzer flags for both fuzzers
dir=$LOOM_BUILD_DIR-clang
work=$LOOM_BUILD_DIR-fuzz
if [ ! -f "$dir/CMakeCache.txt" ]; then
  LOOM_CXX=${LOOM_CLANG:-clang++-14} loom_configure_dir "$dir"
else
  loom_deps
fi
cmake --build "$dir" --target loom_checkpoint_fuzz loom_safetensors_fuzz loom_dcp_fuzz -j "$JOBS" \
  >"$work.build.log" 2>&1 || {
  cat "$work.build.log"
  echo "[loom] fuzz: building the fuzzers failed" >&2
  exit 1
}
results=()
# fuzz NAME SEEDS_SCRIPT: one fuzzer's run in $work/NAME; appends its result line.
fuzz() {
  local name=$1 seeds=$2 status=0
  local here=$work/$name
  mkdir -p "$here/seeds" "$here/corpus"
  rm -f "$here"/fuzz*.log "$here"/crash-* "$here"/leak-* "$here"/timeout-* "$here"/oom-*
  "$LOOM_VENV/bin/python" "$LOOM_ROOT/tests/fuzz/$seeds" "$here/seeds" >&2
  (
  cd "$here"
  # LibTorch keeps static allocations to the end of the process: leak checks would report those.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  start=$SECONDS
  "$dir/tests/loom_${name}_fuzz" corpus seeds -max_total_time="$seconds" -rss_limit_mb=4096 \
    -max_len=65536 -print_final_stats=1 -jobs="$JOBS" -workers="$JOBS" "${extra[@]}" \
    >fuzz.log 2>&1 || status=$?
  elapsed=$((SECONDS - start))
  grep -h -E "ERROR|SUMMARY" fuzz*.log 2>/dev/null | sort | uniq -c |
    sed "s/^/[loom] fuzz: $name: /" >&2 || true
  # Each job's final stats are in its own fuzz-N.log (fuzz.log repeats them). No log, or no stats
  # line, is 0 executions (checked below), not an exit here through pipefail.
  execs=$({ grep -h "stat::number_of_executed_units" fuzz-*.log 2>/dev/null || true; } |
            awk '{s += $2} END {print s + 0}')
  if [ "${status:-0}" != 0 ] || ls crash-* leak-* timeout-* oom-* >/dev/null 2>&1; then
    echo "[loom] fuzz: $name: FINDINGS after $execs executions in $elapsed s (inputs in $here;" \
      "logs fuzz*.log)" >&2
    exit 1
  fi
  if [ "$execs" = 0 ]; then
    tail -n 20 fuzz.log >&2 2>/dev/null || true
    echo "[loom] fuzz: $name: FAILED: no executions reported (no stat::number_of_executed_units" \
      "in $here/fuzz-*.log) after $elapsed s: the fuzzer did not run" >&2
    exit 1
  fi
  echo "$name $execs executions in $elapsed s"
  ) >"$here.result" || return 1
  results+=("$(cat "$here.result")")
}
failed=0
fuzz checkpoint make_seeds.py || failed=1
fuzz safetensors make_safetensors_seeds.py || failed=1
fuzz dcp make_dcp_seeds.py || failed=1
[ "$failed" = 0 ] || exit 1
echo "[loom] fuzz: ok, no findings (limit $seconds s each): $(IFS=';'; echo "${results[*]}" | sed 's/;/, /g')"
