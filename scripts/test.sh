#!/usr/bin/env bash
# The test suite: installs what is missing, checks the formatting (scripts/check-format.sh),
# then builds every test, example and header check with GCC 12 in $LOOM_BUILD_DIR (default
# build/; the tests and examples at -O1, the tests on a shared precompiled header) and runs
# them through ctest (the tests labelled gpu need a GPU and are left out), with
# -DLOOM_WERROR=ON and ccache.
# With --all, as CI runs it (.ci/run): the same, then Clang 14 in $LOOM_BUILD_DIR-clang, which
# builds loom, its tests and examples without optimisation (Clang warns from its front end: -O0
# checks the same code in half the time) and without the compile-only checks (each header
# alone, the compile-fail twins: the GCC half's), and runs the unit, compile-fail and docs
# tests (the runs of processes, installs and long numerical tests are the GCC half's), then
# the checkpoint, safetensors and DCP readers' fuzzers for 60 s each (scripts/fuzz.sh, in the
# Clang tree).
#   bash scripts/test.sh [--all] [ctest args]   e.g. bash scripts/test.sh -L install
# Every other argument goes to the ctest runs.
# Every step runs even when an earlier one fails; the last line sums them up, and the exit
# status is 0 only when all passed.
#   LOOM_GCC, LOOM_CLANG  the two compilers (default g++-12, clang++-14)    JOBS  (default nproc)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
all=0
ctest_args=()
for arg in "$@"; do
  if [ "$arg" = "--all" ]; then all=1; else ctest_args+=("$arg"); fi
done
set -- "${ctest_args[@]}"
start=$SECONDS
status=0
summary=()
loom_deps
# ctest runs JOBS tests at once, each with LibTorch's OpenMP threads (one per core): threads
# that spin while they wait take the cores from the other tests' threads (two fp8 training
# tests took 514 s each side by side, 32 s with passive waits). Waiting threads sleep instead.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

if bash "$LOOM_ROOT/scripts/check-format.sh"; then
  summary+=("format ok")
else
  summary+=("format FAILED")
  status=1
fi

# suite <name> <compiler> <build-dir> <labels left out> [ctest args]
#   suite_cmake_args (an array): extra configure arguments of this suite
suite_cmake_args=()
suite() {
  local name=$1 cxx=$2 dir=$3 exclude=$4 t0=$SECONDS
  shift 4
  echo "[loom] $name: $cxx in $dir" >&2
  if ! LOOM_CXX=$cxx loom_configure_dir "$dir" "${suite_cmake_args[@]}"; then
    summary+=("$name: configure FAILED")
    status=1
    return
  fi
  if ! cmake --build "$dir" -j "$JOBS"; then
    summary+=("$name: build FAILED")
    status=1
    return
  fi
  local result=ok
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS" -LE "$exclude" "$@" 2>&1 | tee "$dir/ctest.log" ||
    { result=FAILED; status=1; }
  local counts
  counts=$(grep -Eo '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$dir/ctest.log" |
             tail -n 1 || true)
  summary+=("$name: ctest $result${counts:+ ($counts)} in $((SECONDS - t0)) s")
  count_tests "$name" "$dir" "$exclude" "$@"
}

# count_tests <name> <build-dir> <labels left out> [ctest args]: prints how many tests are
# registered, how many this run selected, and which it skipped (ctest's "(Skipped)": a check
# that could not run here, LOOM_SKIP_MARKER in cmake/LoomTesting.cmake). A missing test group
# (a skipped test skipped.<group>: what it needs was not found) fails the run: scripts/deps.sh,
# which this script ran, installs what every group needs.
count_tests() {
  local name=$1 dir=$2 exclude=$3
  shift 3
  local registered selected skipped groups
  registered=$(ctest --test-dir "$dir" -N 2>/dev/null | sed -n 's/^Total Tests: //p')
  selected=$(ctest --test-dir "$dir" -N -LE "$exclude" "$@" 2>/dev/null |
               sed -n 's/^Total Tests: //p')
  skipped=$(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (Skipped)$/\1/p' "$dir/ctest.log" | sort -u)
  groups=$(grep '^skipped\.' <<<"$skipped" || true)
  local line="$name: ${registered:-?} tests registered, ${selected:-?} run (labels $exclude left"
  line+=" out), $(grep -c . <<<"$skipped" || true) skipped${skipped:+: $(echo $skipped)}"
  if [ -n "$groups" ]; then
    line+="; test groups MISSING: $(echo $groups) (see their output)"
    status=1
  else
    line+="; every test group registered"
  fi
  echo "[loom] $line" >&2
  summary+=("$line")
}

# The GCC half builds the tests and examples at -O1, the tests on one precompiled header of
# LibTorch and loom (cmake/LoomTesting.cmake; the quick start's translation unit: 130 s at -O3,
# 53 s so); the library keeps -O3.
suite_cmake_args=(-DLOOM_TEST_OPTIMIZATION=-O1 -DLOOM_TEST_PCH=ON)
suite gcc "${LOOM_GCC:-g++-12}" "$LOOM_BUILD_DIR" gpu "$@"

if [ "$all" = 1 ]; then
  # The Clang half checks that loom, its tests and examples compile warning-free with Clang,
  # which warns from its front end alone: it builds without optimisation (half Clang's -O3
  # time), the tests on the shared precompiled header, and without the compile-only checks
  # (each header alone, the compile-fail twins: the GCC half's), and runs the unit,
  # compile-fail and docs tests. The runs of processes (dist, checkpoint resumes, examples,
  # installs, the long numerical ones) are the GCC half's.
  suite_cmake_args=(-DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG" -DLOOM_BUILD_COMPILE_CHECKS=OFF
                    -DLOOM_TEST_OPTIMIZATION= -DLOOM_TEST_PCH=ON)
  suite clang "${LOOM_CLANG:-clang++-14}" "$LOOM_BUILD_DIR-clang" \
    "gpu|packaging|slow|install|dist|checkpoint|example|netns" "$@"

  # The readers' fuzzers (scripts/fuzz.sh) in the Clang tree, LOOM_FUZZ_SECONDS (60) each.
  fuzz_log=$LOOM_BUILD_DIR-fuzz.log
  if bash "$LOOM_ROOT/scripts/fuzz.sh" "${LOOM_FUZZ_SECONDS:-60}" 2>&1 | tee "$fuzz_log"; then
    summary+=("$(tail -n 1 "$fuzz_log" | sed 's/^\[loom\] //')")
  else
    summary+=("fuzz FAILED")
    status=1
  fi
else
  summary+=("clang and fuzz: not run (--all runs them)")
fi

verdict=PASSED
[ "$status" = 0 ] || verdict=FAILED
elapsed=$((SECONDS - start))
summary_line=$(printf '%s; ' "${summary[@]}")
echo "[loom] test.sh $verdict in $((elapsed / 60)) min $((elapsed % 60)) s: ${summary_line%; }"
exit "$status"
