#!/usr/bin/env bash
# loom's benchmarks in one command: builds them (cmake -DLOOM_BUILD_BENCHMARKS=ON in its own
# build tree), runs them, and writes docs/benchmarks.md, the raw JSON under docs/benchmarks/ and
# docs/benchmarks/benchmarks.png. About 6 to 10 minutes on 2 cores. Never part of the tests.
#
#   scripts/run_benchmarks.sh [--install-lightning] [--skip-fabric] [--skip-compile-time]
#                             [--skip-ddp] [--skip-raw] [--skip-contention]
#
#   1. overhead   loom::Runtime vs hand-written LibTorch vs virtual hooks, all six precisions:
#                 instructions per step under callgrind, wall and CPU time natively
#   2. hooks      Google Benchmark: one hook call, static (loom) vs virtual
#   3. fabric     loom vs Lightning Fabric (CPU; 32-true, bf16-mixed; tiny, medium, large MLP).
#                 Needs the `lightning` package in loom's python venv. It is a benchmark-only
#                 dependency and is installed only when asked: --install-lightning runs
#                   $LOOM_VENV/bin/python -m pip install lightning
#                 Without it, and without lightning already installed, this part is skipped.
#                 With it also part 7: loom::optim's fused SGD and Adam vs Fabric with the
#                 default and with fused=True optimizers (1 and 2 threads)
#   4. compile    g++ -std=c++20 -O2 -c of Runtime for every device x precision pair vs the same
#                 steps by hand, best of 7 (compile times vary 10-30% run to run on 2 cores)
#   6. ddp        loom::Ddp vs Python DDP: 2 ranks, gloo, CPU, one thread each; tiny, medium,
#                 large MLP; plus the all-reduce overlap (benchmarks/ddp/)
#   8. raw        loom vs raw PyTorch eager (fused optimizer, no Fabric) and a torch.compile'd
#                 step (compile time reported); CPU, 1 thread (benchmarks/fabric/raw_vs_loom.py)
#   9. contention the medium MLP, loom vs Python, 1 and 2 threads, quiet and with a busy
#                 process beside it, default and passive OpenMP waiting (benchmarks/threads/)
#   report        docs/benchmarks.md and the plot (installs matplotlib into the venv if missing);
#                 part 5 of the page (each precision on the CPU) is measured by hand and kept
#
#   LOOM_BUILD_DIR  build tree (default build-bench)     JOBS  build jobs (default 1: gentle)
#   LOOM_BENCH_THREADS  torch threads for the Fabric comparison (default nproc)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOOM_BUILD_DIR=${LOOM_BUILD_DIR:-$(cd "$here/.." && pwd)/build-bench}
JOBS=${JOBS:-1}
source "$here/lib.sh"
install_lightning=0 fabric=1 compile=1 ddp=1 raw_eager=1 contention=1
for a in "$@"; do
  case "$a" in
    --install-lightning) install_lightning=1 ;;
    --skip-fabric) fabric=0 ;;
    --skip-compile-time) compile=0 ;;
    --skip-ddp) ddp=0 ;;
    --skip-raw) raw_eager=0 ;;
    --skip-contention) contention=0 ;;
    *) echo "run_benchmarks.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
log() { echo "[loom bench] $*" >&2; }

loom_configure -DLOOM_BUILD_BENCHMARKS=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_EXAMPLES=OFF
py="$LOOM_VENV/bin/python"
cmake --build "$LOOM_BUILD_DIR" --target loom_bench_overhead loom_bench_hook_dispatch \
  loom_fabric_train loom_bench_ddp -j "$JOBS" >&2
bin="$LOOM_BUILD_DIR/benchmarks"
raw="$LOOM_ROOT/docs/benchmarks"
mkdir -p "$raw"
start=$SECONDS
{ echo "before: $(uptime)"; } >"$raw/load.txt"

# 1. Overhead: instructions (callgrind), then wall and thread-CPU time (interleaved blocks).
cg="$LOOM_BUILD_DIR/callgrind"
rm -rf "$cg" && mkdir -p "$cg"
if command -v valgrind >/dev/null 2>&1; then
  log "overhead: callgrind (all six precisions x hand/loom/virtual, 20 steps each)"
  (cd "$cg" && valgrind --tool=callgrind --instr-atstart=no \
     "$bin/overhead/loom_bench_overhead" --mode count --steps 20 --warmup 5 \
     >count.json 2>valgrind.log)
  python3 "$LOOM_ROOT/benchmarks/overhead/parse_callgrind.py" "$cg" "$cg/count.json" \
    "$raw/overhead_callgrind.json"
else
  log "overhead: valgrind not found; no instruction counts"
  rm -f "$raw/overhead_callgrind.json"
fi
log "overhead: wall time"
echo "overhead wall run: $(uptime)" >>"$raw/load.txt"
"$bin/overhead/loom_bench_overhead" --mode wall --rounds 21 --block 40 --warmup 20 \
  >"$raw/overhead_wall.json"

# 2. One hook call, static vs virtual.
log "hooks: Google Benchmark"
"$bin/overhead/loom_bench_hook_dispatch" --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$raw/hook_dispatch.json" \
  --benchmark_out_format=json >&2
sed -i "s|$LOOM_ROOT/||g" "$raw/hook_dispatch.json"  # argv[0]: no machine paths in docs/

# 3. loom vs Lightning Fabric.
if [ "$fabric" = 1 ]; then
  if ! "$py" -c 'import lightning' 2>/dev/null && [ "$install_lightning" = 1 ]; then
    log "installing lightning into $LOOM_VENV (benchmark only)"
    "$py" -m pip install -q --disable-pip-version-check lightning >&2
  fi
  if "$py" -c 'import lightning' 2>/dev/null; then
    log "fabric: loom vs Lightning Fabric on the CPU"
    echo "fabric run: $(uptime)" >>"$raw/load.txt"
    "$py" "$LOOM_ROOT/benchmarks/fabric/fabric_vs_loom.py" --loom-bin "$bin/fabric/loom_fabric_train" \
      --out "$raw/fabric_vs_loom.json" --threads "${LOOM_BENCH_THREADS:-$(nproc)}" --reps 3
    log "optim: loom::optim vs Fabric's default and fused optimizers (part 7)"
    echo "optim run: $(uptime)" >>"$raw/load.txt"
    "$py" "$LOOM_ROOT/benchmarks/fabric/optim_vs_fabric.py" \
      --loom-bin "$bin/fabric/loom_fabric_train" --out "$raw/optim_vs_fabric.json" \
      --threads 1,2 --reps 3
    "$py" "$LOOM_ROOT/benchmarks/fabric/profile_step.py" >"$raw/optim_profile.md"
  else
    log "fabric: skipped (lightning is not installed; pass --install-lightning)"
  fi
fi

# 4. Compile time.
if [ "$compile" = 1 ]; then
  log "compile time: best of 7"
  echo "compile-time run: $(uptime)" >>"$raw/load.txt"
  torch_inc=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
  python3 "$LOOM_ROOT/benchmarks/compile_time/measure.py" --root "$LOOM_ROOT" \
    --torch-include "$torch_inc" --out "$raw/compile_time.json" --reps 7 --cxx "${CXX:-g++}"
fi
# 6. loom::Ddp against Python DDP: 2 ranks, gloo, one thread each.
if [ "$ddp" = 1 ]; then
  log "ddp: loom::Ddp vs Python DDP, 2 ranks"
  echo "ddp run: $(uptime)" >>"$raw/load.txt"
  "$py" "$LOOM_ROOT/benchmarks/ddp/ddp_vs_python.py" --bench "$bin/ddp/loom_bench_ddp" \
    --out "$raw/ddp_vs_python.json" --reps 3
fi
# 8. loom vs raw PyTorch eager (fused optimizer, no Fabric) and a torch.compile'd step.
if [ "$raw_eager" = 1 ]; then
  log "raw: loom vs raw PyTorch eager and torch.compile (part 8)"
  echo "raw run: $(uptime)" >>"$raw/load.txt"
  "$py" "$LOOM_ROOT/benchmarks/fabric/raw_vs_loom.py" --loom-bin "$bin/fabric/loom_fabric_train" \
    --out "$raw/raw_vs_loom.json" --threads 1 --reps 3
fi
# 9. Threads under contention: a busy process beside loom and Python, 1 and 2 threads.
if [ "$contention" = 1 ]; then
  log "contention: 1 busy process beside loom and Python (part 9)"
  echo "contention run: $(uptime)" >>"$raw/load.txt"
  "$py" "$LOOM_ROOT/benchmarks/threads/contention.py" --loom-bin "$bin/fabric/loom_fabric_train" \
    --out "$raw/contention.json" --competitors 1 --reps 5
fi
echo "after: $(uptime)" >>"$raw/load.txt"

# The report and the plot.
"$py" -c 'import matplotlib' 2>/dev/null ||
  "$py" -m pip install -q --disable-pip-version-check matplotlib >&2
"$py" "$LOOM_ROOT/benchmarks/report.py" --raw "$raw" --out "$LOOM_ROOT/docs/benchmarks.md" \
  --seconds $((SECONDS - start))
log "wrote docs/benchmarks.md and docs/benchmarks/ in $((SECONDS - start)) s"
