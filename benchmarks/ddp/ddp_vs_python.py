"""loom::Ddp against Python's DistributedDataParallel: 2 ranks, gloo, CPU, one thread per rank,
the tiny, medium and large MLPs of docs/benchmarks.md, steps/s side by side in one run (the
two interleaved, best of --reps); plus loom's all-reduce overlap: the time of a DDP step
against the time of the same step without communication plus one all-reduce of all gradients.

Usage: python ddp_vs_python.py --bench BUILD/benchmarks/ddp/loom_bench_ddp --out OUT.json
                               [--sizes tiny,medium,large] [--precisions 32-true,bf16-mixed]
                               [--reps 3]
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
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for name in a.sizes.split(","):
        sizes, batch, steps, warmup = SIZES[name]
        common = ["--sizes", sizes, "--batch", str(batch), "--steps", str(steps), "--warmup",
                  str(warmup)]
        for precision in a.precisions.split(","):
            best = {"loom": 0.0, "python": 0.0, "compute": 0.0, "comm": 0.0}
            for _ in range(a.reps):
                p = common + ["--precision", precision]
                best["loom"] = max(best["loom"], torchrun(
                    ["--no-python", a.bench, *p, "--mode", "ddp"])["steps_per_s"])
                best["python"] = max(best["python"], torchrun(
                    [str(HERE / "python_ddp.py"), *p])["steps_per_s"])
                best["compute"] = max(best["compute"], torchrun(
                    ["--no-python", a.bench, *p, "--mode", "compute"])["steps_per_s"])
                best["comm"] = max(best["comm"], torchrun(
                    ["--no-python", a.bench, *p, "--mode", "comm"])["steps_per_s"])
            step_ms = 1000 / best["loom"]
            compute_ms, comm_ms = 1000 / best["compute"], 1000 / best["comm"]
            row = {"size": name, "layers": sizes, "batch": batch, "precision": precision,
                   "loom_steps_per_s": round(best["loom"], 1),
                   "python_steps_per_s": round(best["python"], 1),
                   "ratio": round(best["loom"] / best["python"], 3),
                   "step_ms": round(step_ms, 3), "compute_ms": round(compute_ms, 3),
                   "comm_ms": round(comm_ms, 3),
                   "overlap_ratio": round(step_ms / (compute_ms + comm_ms), 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps({"ranks": 2, "backend": "gloo", "threads_per_rank": 1,
                                       "reps": a.reps, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
