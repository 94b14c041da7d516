"""Per-rank memory and step time of loom::Ddp, loom::Zero stage 1 and 2 and loom::Fsdp, side
by side, and Python's FSDP2 on the same model.

Runs loom_bench_zero (benchmarks/memory/zero.cpp) under torchrun for each strategy at 2 and 4
ranks (gloo, CPU, one compute thread per rank) and prints a table: each rank's largest
parameter, gradient and optimizer-state bytes after a step, the allocator's peak during the
step, and the step time, with the ratios to Ddp at the same world size; then Python's FSDP2
(fsdp_python.py) on the same model at each world size, its step time beside loom::Fsdp's.
Targets: stage 1's optimizer state <= Ddp's / world + one bucket; stage 2's gradients
likewise; step time <= 1.15x Ddp's at 2 ranks (Zero), <= 1.3x (Fsdp); Fsdp's parameters,
gradients and state together, and its peak, <= Ddp's / world + two units (the largest
Linear's parameters, twice), and its step time <= Python FSDP2's. fsdp_keep (Fsdp with
reshard_after_forward off) is reported beside it. --limit-mib N: then Ddp and Fsdp at the largest
world size with the counting allocator refusing to hold more than N MiB per rank.

Usage: python zero_memory.py --bench BUILD/benchmarks/loom_bench_zero [--worlds 2,4]
                             [--bucket-mib 4] [--limit-mib N] [--out OUT.json]
                             [-- --layers 20 --steps 12 ...]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TORCHRUN = Path(sys.executable).with_name("torchrun")
PYTHON_FSDP2 = Path(__file__).with_name("fsdp_python.py")
MIB = 1 << 20


def launch(world, cmd, what, attempts=1, may_fail=False):
    """The first JSON line of `cmd` under torchrun; stock gloo's rare SIGABRT in Python's
    runs is retried (`attempts`); `may_fail`: a failed run's JSON line (or None) is returned."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [str(TORCHRUN), "--standalone", f"--nproc-per-node={world}", *cmd]
    for attempt in range(attempts):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        if r.returncode == 0 or may_fail:
            return lines[0] if lines else None
    raise SystemExit(f"zero_memory: {what} at {world} failed:\n{r.stdout[-2000:]}"
                     f"{r.stderr[-2000:]}")


def torchrun(bench, world, strategy, extra):
    r = launch(world, ["--no-python", bench, "--strategy", strategy, *extra], strategy)
    if r is None:
        raise SystemExit(f"zero_memory: no result from {strategy} at {world}")
    return r


def flag(extra, name, fallback):
    return int(extra[extra.index(name) + 1]) if name in extra else fallback


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--out")
    ap.add_argument("--bucket-mib", type=int, default=4, help="ZeroOptions::bucket_bytes")
    ap.add_argument("--limit-mib", type=int, default=0,
                    help="then Ddp and Fsdp under this per-rank limit at the largest world")
    ap.add_argument("extra", nargs="*", help="passed to loom_bench_zero (after --)")
    a = ap.parse_args()
    bucket = a.bucket_mib * MIB
    extra = [*a.extra, "--bucket-mib", str(a.bucket_mib)]
    results, failed, fsdp = [], [], {}
    print("| strategy | ranks | parameters | gradients | optimizer state | peak | step | "
          "state / Ddp | gradients / Ddp | step / Ddp |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world in map(int, a.worlds.split(",")):
        ddp = None
        for strategy in ("ddp", "zero1", "zero2", "fsdp", "fsdp_keep"):
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
            if strategy in ("zero1", "zero2") and world == 2 and step > 1.15:
                failed.append(f"{strategy} at 2 ranks: step {step:.2f}x Ddp's (target 1.15x)")
            if strategy == "fsdp":
                width = flag(a.extra, "--width", 1600)
                unit = (width * width + width) * 4
                held = r["parameter_bytes"] + r["gradient_bytes"] + r["state_bytes"]
                total = ddp["parameter_bytes"] + ddp["gradient_bytes"] + ddp["state_bytes"]
                if held > total / world + 2 * unit:
                    failed.append(f"fsdp at {world}: parameters + gradients + state above "
                                  f"Ddp's / world + two units")
                if r["peak_bytes"] > ddp["peak_bytes"] / world + 2 * unit:
                    failed.append(f"fsdp at {world}: peak above Ddp's / world + two units")
                if world == 2 and step > 1.3:
                    failed.append(f"fsdp at 2 ranks: step {step:.2f}x Ddp's (target 1.3x)")
                fsdp[world] = r
    print()
    print("| ranks | loom::Fsdp step | Python FSDP2 step | loom / Python |")
    print("|---:|---:|---:|---:|")
    for world, r in fsdp.items():
        py = launch(world, [str(PYTHON_FSDP2), *a.extra], "Python FSDP2", attempts=3)
        results.append(py)
        ratio = r["step_ms"] / py["step_ms"]
        print(f"| {world} | {r['step_ms']:.0f} ms | {py['step_ms']:.0f} ms | {ratio:.2f} |")
        if ratio > 1.0:
            failed.append(f"fsdp at {world}: step {ratio:.2f}x Python FSDP2's (target 1.0x)")
    if a.limit_mib:
        world = max(fsdp)
        print()
        print(f"| strategy | ranks | under a {a.limit_mib} MiB limit per rank |")
        print("|---|---:|---|")
        for strategy in ("ddp", "fsdp"):
            r = launch(world, ["--no-python", a.bench, "--strategy", strategy, *extra,
                               "--limit-mib", str(a.limit_mib)], strategy, may_fail=True)
            outcome = ("out of memory (the allocator refused)" if r is None or
                       "out_of_memory" in r else
                       f"trains: peak {r['peak_bytes'] / MIB:.0f} MiB, step {r['step_ms']:.0f} ms")
            print(f"| {strategy} | {world} | {outcome} |")
            results.append({"strategy": strategy, "world": world, "limit_mib": a.limit_mib,
                            "outcome": outcome})
            if (strategy == "fsdp") == outcome.startswith("out of memory"):
                failed.append(f"{strategy} under the limit: {outcome}")
    print(f"model: {results[0]['parameters'] / 1e6:.1f} M parameters; bucket {a.bucket_mib} MiB")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    for f in failed:
        print("target missed: " + f)


if __name__ == "__main__":
    main()
