"""What DDP costs, loom::Ddp beside Python's DistributedDataParallel: 2 ranks, gloo, CPU, one
compute thread per rank, the tiny, medium and large MLPs of docs/benchmarks.md, every figure
from one run (the variants interleaved, best of --reps).

Per model and precision:
- the DDP tax: the step minus the same step with every backward under no_backward_sync
  (loom) / no_sync() (Python); target loom's tax <= Python's;
- the bound: loom's step against (its no-sync step + the reducer's bucket all-reduces run
  alone, one after the other); target <= 1.10 (below 1: communication overlaps the backward);
- for the --extras precisions: gradient accumulation, 4 micro-batches per step (the first 3
  under no_sync), loom against Python; the fp16 and bf16 compression hooks against the plain
  all-reduce, on both sides.

Usage: python ddp_vs_python.py --bench BUILD/benchmarks/ddp/loom_bench_ddp --out OUT.json
                               [--sizes tiny,medium,large] [--precisions 32-true,bf16-mixed]
                               [--extras 32-true] [--reps 3] [--pin]
--pin: each rank's threads on its half of the cores (a machine with many cores).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
# name: (layer sizes, batch, timed steps, warm-up steps)
SIZES = {
    "tiny": ("32,64,64,10", 32, 600, 30),
    "medium": ("256,512,512,10", 64, 150, 10),
    "large": ("1024,2048,2048,10", 256, 40, 3),
}


def torchrun(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    r = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node=2", *cmd], env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"ddp_vs_python: {cmd[:3]} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"ddp_vs_python: no result from {cmd[:3]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="tiny,medium,large")
    ap.add_argument("--precisions", default="32-true,bf16-mixed")
    ap.add_argument("--extras", default="32-true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pin", action="store_true")
    a = ap.parse_args()
    pin = ["--pin"] if a.pin else []
    rows = []
    for name in a.sizes.split(","):
        sizes, batch, steps, warmup = SIZES[name]
        common = ["--sizes", sizes, "--batch", str(batch), "--steps", str(steps), "--warmup",
                  str(warmup), *pin]
        for precision in a.precisions.split(","):
            p = common + ["--precision", precision]
            # variant: (command, arguments)
            loom = ["--no-python", a.bench, *p]
            python = [str(HERE / "python_ddp.py"), *p]
            variants = {
                "loom": loom + ["--mode", "ddp"], "loom_nosync": loom + ["--mode", "nosync"],
                "python": python + ["--mode", "ddp"],
                "python_nosync": python + ["--mode", "nosync"],
                "buckets": loom + ["--mode", "buckets"],
            }
            if precision in a.extras.split(","):
                variants.update({
                    "loom_k4": loom + ["--accumulate", "4"],
                    "python_k4": python + ["--accumulate", "4"],
                    "loom_fp16": loom + ["--comm-hook", "fp16"],
                    "loom_bf16": loom + ["--comm-hook", "bf16"],
                    "python_fp16": python + ["--comm-hook", "fp16"],
                    "python_bf16": python + ["--comm-hook", "bf16"],
                })
            runs = {v: [] for v in variants}
            for _ in range(a.reps):
                for v, cmd in variants.items():
                    runs[v].append(torchrun(cmd)["ms_per_step"])
            ms = {v: min(t) for v, t in runs.items()}
            row = {"size": name, "layers": sizes, "batch": batch, "precision": precision}
            row.update({f"{v}_ms": round(t, 4) for v, t in ms.items()})
            # The spread: each variant's slowest run against its best.
            row["spread"] = round(max(max(t) / min(t) - 1 for t in runs.values()), 3)
            row["runs_ms"] = {v: [round(x, 4) for x in t] for v, t in runs.items()}
            row["loom_tax_ms"] = round(ms["loom"] - ms["loom_nosync"], 4)
            row["python_tax_ms"] = round(ms["python"] - ms["python_nosync"], 4)
            row["loom_vs_python"] = round(ms["python"] / ms["loom"], 3)
            row["bound"] = round(ms["loom"] / (ms["loom_nosync"] + ms["buckets"]), 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps({"ranks": 2, "backend": "gloo", "threads_per_rank": 1,
                                       "pinned": a.pin, "cores": os.cpu_count(),
                                       "reps": a.reps, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
