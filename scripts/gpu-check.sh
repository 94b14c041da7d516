#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and a python that has torch (with CUDA), but no
# OS packages and no network, configure loom against that torch, build the GPU tests and the
# host-to-device prefetch, fp8, DDP-cost, asynchronous-checkpoint, activation-checkpointing and
# CUDA-graph benchmarks, run them, and write a short report.
# About 9 minutes at most.
#
# Usage: scripts/gpu-check.sh [report-dir]        (default $OUT, else build-gpu-report)
#   LOOM_THIRD_PARTY   packed headers (scripts/pack-gpu-deps.sh; default build-gpu-deps)
#   LOOM_PYTHON        the python with torch (default: the first of python3, /opt/torch/.venv,
#                      ~/.cache/loom/torch-*/bin/python that imports torch)
#   LOOM_GPU_BUILD     build tree (default build-gpu)    JOBS  build jobs (default nproc)
#   LOOM_GPU_BUDGET_S  total seconds (default 540)
# Exit status: 0 all ran and passed; 1 a step failed; 77 no GPU (nothing run on a device).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${OUT:-$root/build-gpu-report}}
third=${LOOM_THIRD_PARTY:-$root/build-gpu-deps}
build=${LOOM_GPU_BUILD:-$root/build-gpu}
jobs=${JOBS:-$(nproc)}
deadline=$((SECONDS + ${LOOM_GPU_BUDGET_S:-540}))
mkdir -p "$out"
report="$out/gpu-check.md"
: >"$report"
say() { echo "$*" | tee -a "$report"; }
left() { local s=$((deadline - SECONDS)); [ "$s" -gt 5 ] && echo "$s" || echo 5; }
finish() {
  say ""
  say "status: $1 (after ${SECONDS}s)"
  exit "$2"
}

say "# loom GPU check"
say ""
say "- commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "$(git -C "$root" status --porcelain 2>/dev/null | grep -q . && echo '(working tree modified)')"

# 1. The python with torch, and what it sees.
py=""
for c in "${LOOM_PYTHON:-}" python3 /opt/torch/.venv/bin/python3 "$HOME"/.cache/loom/torch-*/bin/python; do
  [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
  if "$c" -c 'import torch' >/dev/null 2>&1; then py=$(command -v "$c"); break; fi
done
[ -n "$py" ] || { say "- no python with torch found (set LOOM_PYTHON)"; finish "FAILED" 1; }
read -r torch_version torch_cuda gpus gpu_name < <("$py" - <<'PY'
import torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
name = torch.cuda.get_device_name(0).replace(" ", "_") if n else "-"
print(torch.__version__, torch.version.cuda, n, name)
PY
)
prefix=$("$py" -c 'import sys, torch.utils; sys.stdout.write(torch.utils.cmake_prefix_path)')
bindir=$(dirname "$py")
cmake_bin=$(command -v cmake || echo "$bindir/cmake")
ninja_bin=$(command -v ninja || echo "$bindir/ninja")
say "- python: $py; torch $torch_version (CUDA $torch_cuda); GPUs: $gpus ($gpu_name)"
say "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || echo none)"
say "- compiler: $(${CXX:-c++} --version 2>/dev/null | head -1); cmake: $("$cmake_bin" --version | head -1)"
say "- third-party headers: $third"
[ -f "$third/catch2/catch.hpp" ] && [ -f "$third/boost/hana.hpp" ] && [ -f "$third/cmake/Catch.cmake" ] ||
  { say "- $third lacks catch2/catch.hpp, boost/hana.hpp or cmake/Catch.cmake: run scripts/pack-gpu-deps.sh"; finish "FAILED" 1; }

# 2. Configure: the packed headers stand in for Boost's and Catch2's CMake packages.
generator=()
libdeflate=()  # packed by pack-gpu-deps.sh: the checkpoints' CRC-32
[ -f "$third/libdeflate.h" ] && [ -f "$third/lib/libdeflate.so" ] &&
  libdeflate=(-DLOOM_LIBDEFLATE_INCLUDE="$third" -DLOOM_LIBDEFLATE_LIBRARY="$third/lib/libdeflate.so")
[ -x "$ninja_bin" ] && generator=(-G Ninja -DCMAKE_MAKE_PROGRAM="$ninja_bin")
timeout "$(left)" "$cmake_bin" -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DTorch_DIR="$prefix/Torch" \
  -DLOOM_THIRD_PARTY_DIR="$third" -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON \
  -DLOOM_GLOO_INCLUDE_DIR="$third" -DLOOM_BUILD_DIST="$([ -f "$third/gloo/algorithm.h" ] && echo ON || echo OFF)" \
  -DLOOM_PYTHON="$py" "${libdeflate[@]}" \
  -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON \
  -DLOOM_BUILD_TESTS=ON -DLOOM_BUILD_GPU_TESTS=ON -DLOOM_BUILD_BENCHMARKS=ON \
  -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_INSTALL=OFF -DLOOM_WERROR=OFF >"$out/configure.log" 2>&1 ||
  { tail -n 30 "$out/configure.log"; say "- configure failed: configure.log"; finish "FAILED" 1; }
say "- configured in ${SECONDS}s"

# 3. Build only what the check runs.
targets=(loom_gpu_tests loom_precision_tests loom_bench_prefetch_cuda loom_bench_fp8_mlp
         loom_bench_checkpoint loom_bench_activation_checkpoint  # + optim.parity_cuda
         loom_fabric_train)  # section 10: a step as one CUDA graph
# dist.cuda_fsdp: loom::Fsdp on one rank over NCCL against one process, and its peak memory.
# dist.cuda_nccl, dist.cuda_zero (loom::Zero stage 2 on NCCL): 2 ranks on GPUs 0 and 1 when
# torch sees 2 GPUs, else one rank compared with a one-process run only (a smoke test: the
# summary says so); dist.cuda_gloo: 2 ranks sharing GPU 0; dist.cuda_detail: the same under
# TORCH_DISTRIBUTED_DEBUG=DETAIL (c10d's ProcessGroupWrapper around gloo on CUDA tensors).
[ -f "$third/gloo/algorithm.h" ] && targets+=(loom_dist_worker loom_fsdp_worker)
# The DDP cost benchmark (section 7): loom::dist and CLI11's packed headers.
ddp_bench=0
[ -f "$third/gloo/algorithm.h" ] && [ -f "$third/CLI/CLI.hpp" ] && { targets+=(loom_bench_ddp); ddp_bench=1; }
timeout "$(left)" "$cmake_bin" --build "$build" --target "${targets[@]}" \
  -j "$jobs" >"$out/build.log" 2>&1 ||
  { grep -E 'error|FAILED' "$out/build.log" | head -n 20; say "- build failed: build.log"; finish "FAILED" 1; }
say "- built in ${SECONDS}s"

if [ "$gpus" = 0 ]; then
  say "- no GPU: torch sees no CUDA device, so the gpu tests and the benchmark were not run"
  "$build/benchmarks/loom_bench_prefetch_cuda" >"$out/bench.txt" 2>&1
  say "- benchmark without a GPU says: $(head -n 1 "$out/bench.txt")"
  finish "SKIPPED (no GPU)" 77
fi

# 4. The tests labelled gpu (among them: loom::Profiler's trace holds the CUDA kernels of its
# window, tests/gpu/toolbox_cuda_test.cpp; loom::Published copies a CUDA learner's weights to
# pinned CPU snapshots on a side stream, without a host wait, tests/gpu/published_cuda_test.cpp).
status=0
timeout "$(left)" ctest --test-dir "$build" -L gpu --output-on-failure --timeout 180 \
  >"$out/ctest.log" 2>&1 || status=1
say ""
say "## GPU tests (ctest -L gpu)"
say ""
say "$(grep -E 'tests passed|tests failed|Total Test time' "$out/ctest.log" || tail -n 5 "$out/ctest.log")"
grep -E '^\s*[0-9]+ - .*\((Failed|Timeout|Exception)' "$out/ctest.log" | sed 's/^/    /' | tee -a "$report"
# What the distributed CUDA cases compared: their result lines (ctest keeps a passing test's
# output in LastTest.log only). On one GPU, NCCL runs one rank: nothing across ranks.
smoke_only=""
last="$build/Testing/Temporary/LastTest.log"
if [ -f "$last" ] && grep -q '^dist cuda_' "$last"; then
  say ""
  say "## Distributed CUDA cases (dist.cuda_nccl, dist.cuda_gloo, dist.cuda_zero, dist.cuda_detail, dist.cuda_fsdp)"
  say ""
  grep -hE '^dist cuda_[a-z]+: ' "$last" | sed 's/^/- /' | tee -a "$report"
  smoke_only=$(grep -oE '^dist cuda_[a-z]+: ok, smoke test only: 1 GPU, nothing compared across ranks' "$last" |
    cut -d: -f1 | sed 's/^dist /dist./' | tr '\n' ' ' | sed 's/ $//')
  [ -n "$smoke_only" ] &&
    say "- smoke test only: 1 GPU, nothing compared across ranks in $smoke_only (each ran 1 rank" \
        "against a one-process run); NCCL between ranks needs a machine with 2 GPUs"
fi

# 5. Host-to-device prefetch, 64 MiB pinned batches: the benchmark behind the Cuda default.
say ""
say "## Host-to-device prefetch benchmark (loom_bench_prefetch_cuda 64 16 3)"
timeout "$(left)" "$build/benchmarks/loom_bench_prefetch_cuda" 64 16 3 >"$out/bench.txt" 2>&1 || status=1
"$py" - "$out/bench.txt" <<'PY' | tee -a "$report" || status=1
import re, sys
kv, peaks = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\.peak_mib\.epoch(\d+) off (\S+) on (\S+)", line)
    if m:
        peaks.setdefault(m[1], []).append((float(m[3]), float(m[4])))
    elif len(line.split()) == 2:
        k, v = line.split()
        kv[k] = v
print()
print(f"copy of one batch {float(kv['copy_ms']):.3f} ms; one matmul {float(kv['matmul_ms']):.3f} ms")
print()
print("| case | step ms | mean ms/step, no prefetch | with prefetch | ratio | target | peak MiB per epoch (prefetch) |")
print("|---|---:|---:|---:|---:|---:|---|")
ok = True
for case, target in (("h2d_bound", 0.85), ("compute_bound", 1.02)):
    r = float(kv[f"{case}.ratio"])
    on_peaks = [p[1] for p in peaks.get(case, [])]
    flat = max(on_peaks) - min(on_peaks) < 1.0 if on_peaks else False
    ok = ok and flat
    print(f"| {case} | {float(kv[case + '.step_ms']):.3f} | {float(kv[case + '.off_ms']):.3f} | "
          f"{float(kv[case + '.on_ms']):.3f} | {r:.3f} | <= {target} {'PASS' if r <= target else 'FAIL'} | "
          f"{', '.join(f'{p:.0f}' for p in on_peaks)} {'flat' if flat else 'NOT FLAT'} |")
print()
print("This benchmark decides the Cuda prefetch default (docs/data-path.md); the check only reports.")
sys.exit(0 if ok else 1)
PY

# 6. fp8: one MLP block's training step (8192 tokens, 4096 -> 16384 -> 4096), bf16 autocast
#    against loom::fp8::linear, and both loss curves over 200 steps (docs/fp8.md).
say ""
say "## fp8 MLP block (loom_bench_fp8_mlp cuda 8192 4096 16384 200)"
timeout "$(left)" "$build/benchmarks/loom_bench_fp8_mlp" cuda 8192 4096 16384 200 \
  >"$out/fp8.txt" 2>&1 || status=1
"$py" - "$out/fp8.txt" <<'PY' | tee -a "$report" || status=1
import sys
lines = open(sys.argv[1]).read().splitlines()
if lines and lines[0].startswith("no fp8"):
    print("\n- " + lines[0] + ": not run")
    sys.exit(0)
kv = {l.split()[0] + " " + l.split()[1]: l.split()[2] for l in lines if l.startswith(("bf16 ", "fp8 "))}
if not kv:
    print("\n" + "\n".join(lines[-5:]))
    sys.exit(1)
speedup = float(next(l.split()[1] for l in lines if l.startswith("speedup")))
print(f"\nsteps/s: bf16 {float(kv['bf16 steps_per_s']):.2f}, fp8 {float(kv['fp8 steps_per_s']):.2f}; "
      f"fp8 / bf16 = {speedup:.2f}x (target >= 1.5: {'PASS' if speedup >= 1.5 else 'FAIL'})\n")
ops = dict((l.split()[1], float(l.split()[2])) for l in lines if l.startswith("op "))
if ops:
    print("| where the time goes (one call, ms) | bf16 | fp8 |\n|---|---:|---:|")
    print(f"| first layer's product (operands cast) | {ops.get('bf16_mm', 0):.3f} | {ops.get('fp8_mm', 0):.3f} |")
    print(f"| cast of the hidden activation to e4m3 | - | {ops.get('fp8_cast_hidden', 0):.3f} |")
    print(f"| first layer, forward + backward | {ops.get('bf16_linear_fwd_bwd', 0):.3f} | {ops.get('fp8_linear_fwd_bwd', 0):.3f} |")
    print()
print("| step | loss bf16 | loss fp8 |\n|---:|---:|---:|")
for l in lines:
    if l.startswith("loss "):
        _, step, a, b = l.split()
        if int(step) % 50 == 0 or l == [x for x in lines if x.startswith("loss ")][-1]:
            print(f"| {step} | {a} | {b} |")
PY

# 7. What DDP costs with room to overlap: the CPU benchmark of docs/benchmarks.md part 6 (2 ranks,
#    gloo, one compute thread each), each rank pinned to half of this machine's cores, so gloo's
#    threads run beside the backward pass. At most 150 s; reported, not a pass/fail step.
say ""
say "## DDP cost on the CPU, ranks pinned (benchmarks/ddp/ddp_vs_python.py --pin)"
if [ "$ddp_bench" = 1 ]; then
  budget=$(left); [ "$budget" -gt 150 ] && budget=150
  timeout "$budget" "$py" "$root/benchmarks/ddp/ddp_vs_python.py" \
    --bench "$build/benchmarks/ddp/loom_bench_ddp" --out "$out/ddp_vs_python.json" \
    --sizes tiny,medium --precisions 32-true --extras 32-true --reps 1 --pin \
    >"$out/ddp.txt" 2>&1
  ddp_status=$?
  "$py" - "$out/ddp_vs_python.json" <<'PY' | tee -a "$report"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except OSError:
    print("\n- no result (timed out or failed: ddp.txt)")
    sys.exit(0)
print(f"\n{d['cores']} cores, each rank pinned to half; best of {d['reps']}\n")
print("| model | loom step ms | no-sync ms | buckets alone ms | bound (<= 1.10) | loom tax ms | "
      "Python tax ms | loom k=4 ms | Python k=4 ms | loom fp16 / bf16 hook ms |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in d["rows"]:
    print(f"| {r['size']} | {r['loom_ms']:.3f} | {r['loom_nosync_ms']:.3f} | {r['buckets_ms']:.3f} | "
          f"{r['bound']:.2f} | {r['loom_tax_ms']:.3f} | {r['python_tax_ms']:.3f} | "
          f"{r['loom_k4_ms']:.3f} | {r['python_k4_ms']:.3f} | "
          f"{r['loom_fp16_ms']:.3f} / {r['loom_bf16_ms']:.3f} |")
PY
  [ "$ddp_status" = 0 ] || say "- exit status $ddp_status (124: the 150 s budget ran out)"
else
  say "- not built (no gloo or CLI11 headers in $third: scripts/pack-gpu-deps.sh)"
fi

# 8. Asynchronous checkpoint saves on CUDA (docs/checkpoints.md): 100M parameters and their
#    Adam state on the GPU (1.2 GB); how long a durable loom::Checkpoints::save(...,
#    {.async = true}) blocks the caller once its pinned buffers exist (a run's second save),
#    against the same save made synchronously; and the first one's. At most 90 s; reported.
say ""
say "## Asynchronous checkpoint save on CUDA (benchmarks/checkpoint/save_load.cpp)"
budget=$(left); [ "$budget" -gt 90 ] && budget=90
ckdir="$build/checkpoint-bench"
mkdir -p "$ckdir"
if timeout "$budget" "$build/benchmarks/checkpoint/loom_bench_checkpoint" "$ckdir" 100 10 1 cuda \
     >"$out/checkpoint_cuda.txt" 2>&1; then
  line=$(grep '^loom ' "$out/checkpoint_cuda.txt")
  say ""
  say "- $line"
  say "- $(echo "$line" | tr ' ' '\n' | awk -F= '$1 == "save_s" {s = $2}
      $1 == "save_nosync_s" {n = $2} $1 == "async_blocked_s" {b = $2}
      $1 == "async_first_blocked_s" {f = $2}
      END {printf "durable, buffers reused: blocked %.3f s against the synchronous durable save of %.3f s: %.3fx (target <= 0.10); the first (buffers allocated, no sync) %.3f s against %.3f s without sync", b, s, b / s, f, n}')"
else
  say "- failed or timed out: checkpoint_cuda.txt"
fi
rm -rf "$ckdir"

# 9. Activation checkpointing's memory on the GPU (docs/memory.md): the CPU benchmark's 16-block
#    MLP at batch 256, activation memory from the caching allocator's statistics. At most 60 s.
say ""
say "## Activation checkpointing on CUDA (loom_bench_activation_checkpoint --cuda 1)"
budget=$(left); [ "$budget" -gt 60 ] && budget=60
if timeout "$budget" "$build/benchmarks/loom_bench_activation_checkpoint" --cuda 1 --steps 5 \
     >"$out/activation_checkpoint_cuda.txt" 2>&1; then
  say ""
  sed 's/^/    /' "$out/activation_checkpoint_cuda.txt" >>"$report"
else
  say "- failed or timed out: activation_checkpoint_cuda.txt"
fi

# 10. A whole step as one CUDA graph (docs/runtime.md, docs/benchmarks.md part 8): loom eager,
#     loom through loom::cuda::GraphedStep, raw PyTorch eager with the fused optimizer, a
#     torch.compile'd step and Python's torch.cuda.graph capture, tiny and large MLP, 32-true,
#     fused Adam. At most 150 s; reported (the bitwise replay test is in ctest -L gpu).
say ""
say "## A step as one CUDA graph (benchmarks/fabric/raw_vs_loom.py --device cuda)"
budget=$(left); [ "$budget" -gt 150 ] && budget=150
if timeout "$budget" "$py" "$root/benchmarks/fabric/raw_vs_loom.py"      --loom-bin "$build/benchmarks/fabric/loom_fabric_train" --device cuda --threads 1      --sizes tiny,large --precisions 32-true --optimizers adam --reps 2      --out "$out/raw_vs_loom_cuda.json" >"$out/raw_vs_loom_cuda.txt" 2>&1; then
  say ""
  sed 's/^/    /' "$out/raw_vs_loom_cuda.txt" >>"$report"
else
  say "- failed or timed out: raw_vs_loom_cuda.txt"
  tail -n 5 "$out/raw_vs_loom_cuda.txt" | sed 's/^/    /' >>"$report"
fi

# ---- Optional: loom vs Lightning Fabric on CUDA (scripts/gpu-fabric-check.sh) ----------------
# Off by default (LOOM_GPU_FABRIC=1 turns it on); needs lightning already installed in the python
# with torch. Reports into its own gpu-fabric-check.md and never changes this check's status.
if [ "${LOOM_GPU_FABRIC:-0}" = 1 ]; then
  say ""
  say "## Optional: loom vs Lightning Fabric on CUDA (gpu-fabric-check.md)"
  LOOM_PYTHON="$py" LOOM_GPU_BUILD="$build" JOBS="$jobs" \
    timeout "$(left)" bash "$root/scripts/gpu-fabric-check.sh" "$out" >/dev/null 2>&1
  say "- exit status $? (0 ran, 77 skipped: no lightning or no GPU)"
fi
# ---- end of the optional Fabric section ---------------------------------------------------------

smoke_note=""
[ -n "$smoke_only" ] && smoke_note=", but $smoke_only only smoke-tested: 1 GPU, nothing compared across ranks"
[ "$status" = 0 ] && finish "PASSED$smoke_note" 0 || finish "FAILED$smoke_note" 1
