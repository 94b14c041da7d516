"""Per-rank memory and step time of loom::Ddp, loom::Zero stage 1 and stage 2, side by side.

Runs loom_bench_zero (benchmarks/memory/zero.cpp) under torchrun for each strategy at 2 and 4
ranks (gloo, CPU, one compute thread per rank) and prints a table: each rank's largest
parameter, gradient and optimizer-state bytes after a step, the allocator's peak during the
step, and the step time, with the ratios to Ddp at the same world size. Targets: stage 1's
optimizer state <= Ddp's / world + one bucket; stage 2's gradients likewise; step time <= 1.15x
Ddp's at 2 ranks.

Usage: python zero_memory.py --bench BUILD/benchmarks/loom_bench_zero [--worlds 2,4]
                             [--bucket-mib 4] [--out OUT.json] [-- --steps 12 ...]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TORCHRUN = Path(sys.executable).with_name("torchrun")
MIB = 1 << 20


def torchrun(bench, world, strategy, extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [str(TORCHRUN), "--standalone", f"--nproc-per-node={world}", "--no-python", bench,
           "--strategy", strategy, *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"zero_memory: {strategy} at {world} failed:\n{r.stdout[-2000:]}"
                         f"{r.stderr[-2000:]}")
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"zero_memory: no result from {strategy} at {world}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--out")
    ap.add_argument("--bucket-mib", type=int, default=4, help="ZeroOptions::bucket_bytes")
    ap.add_argument("extra", nargs="*", help="passed to loom_bench_zero (after --)")
    a = ap.parse_args()
    bucket = a.bucket_mib * MIB
    extra = [*a.extra, "--bucket-mib", str(a.bucket_mib)]
    results, failed = [], []
    print("| strategy | ranks | parameters | gradients | optimizer state | peak | step | "
          "state / Ddp | gradients / Ddp | step / Ddp |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world in map(int, a.worlds.split(",")):
        ddp = None
        for strategy in ("ddp", "zero1", "zero2"):
            r = torchrun(a.bench, world, strategy, extra)
            results.append(r)
            ddp = ddp or r
            state, grads = r["state_bytes"] / ddp["state_bytes"], r["gradient_bytes"] / ddp["gradient_bytes"]
            step = r["step_ms"] / ddp["step_ms"]
            print(f"| {strategy} | {world} | {r['parameter_bytes'] / MIB:.1f} MiB | "
                  f"{r['gradient_bytes'] / MIB:.1f} MiB | {r['state_bytes'] / MIB:.1f} MiB | "
                  f"{r['peak_bytes'] / MIB:.1f} MiB | {r['step_ms']:.0f} ms | {state:.2f} | "
                  f"{grads:.2f} | {step:.2f} |")
            bound_state = ddp["state_bytes"] / world + bucket
            bound_grads = ddp["gradient_bytes"] / world + bucket
            if strategy != "ddp" and r["state_bytes"] > bound_state:
                failed.append(f"{strategy} at {world}: state above Ddp's / world + one bucket")
            if strategy == "zero2" and r["gradient_bytes"] > bound_grads:
                failed.append(f"{strategy} at {world}: gradients above Ddp's / world + one bucket")
            if strategy != "ddp" and world == 2 and step > 1.15:
                failed.append(f"{strategy} at 2 ranks: step {step:.2f}x Ddp's (target 1.15x)")
    print(f"model: {results[0]['parameters'] / 1e6:.1f} M parameters; bucket {a.bucket_mib} MiB")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    for f in failed:
        print("target missed: " + f)


if __name__ == "__main__":
    main()
