#!/usr/bin/env bash
# Builds and runs the CPU prefetch benchmark (benchmarks/data/prefetch_cpu.cpp): writes the raw
# Google Benchmark JSON to docs/benchmarks/prefetch_cpu.json and prints a Markdown table for
# docs/data-path.md. Extra arguments go to the benchmark (e.g. --benchmark_filter=L_ms:5/).
#   LOOM_BUILD_DIR  build tree (default build-bench)    JOBS  build jobs (default nproc)
set -euo pipefail
LOOM_BUILD_DIR=${LOOM_BUILD_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build-bench}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
loom_configure -DLOOM_BUILD_BENCHMARKS=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_EXAMPLES=OFF
cmake --build "$LOOM_BUILD_DIR" --target loom_bench_prefetch_cpu -j "$JOBS" >&2
out="$LOOM_ROOT/docs/benchmarks/prefetch_cpu.json"
mkdir -p "$(dirname "$out")"
"$LOOM_BUILD_DIR/benchmarks/loom_bench_prefetch_cpu" --benchmark_out="$out" \
  --benchmark_out_format=json "$@" >&2
python3 - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
ctx = doc["context"]
print(f"<!-- {ctx.get('date')} host {ctx.get('host_name')}, {ctx.get('num_cpus')} CPUs, "
      f"load average {ctx.get('load_avg')} -->")
print("| L ms | C ms | max(L, C) | inline ms/batch | depth 1 ms/batch (x max) | depth 2 ms/batch (x max) |")
print("|---:|---:|---:|---:|---:|---:|")
rows = {}
for b in doc["benchmarks"]:
    if b.get("aggregate_name") != "median":
        continue
    key = (int(b["L_ms"]), int(b["C_ms"]))
    rows.setdefault(key, {})[int(b["depth"])] = b["ms_per_batch"]
for (l, c), r in rows.items():
    m = max(l, c)
    cell = lambda d: f"{r[d]:.2f} ({r[d] / m:.2f}x)" if d in r else "-"
    print(f"| {l} | {c} | {m} | {r.get(0, float('nan')):.2f} | {cell(1)} | {cell(2)} |")
PY
