#!/usr/bin/env python3
"""Threads under contention: loom and Python on a machine that another process keeps busy.

The medium MLP of fabric_vs_loom.py (256-512-512-10, batch 64, SGD(lr=0.01, momentum=0.9),
fused on both sides, 32-true), trained by loom (loom_fabric_train --optimizer sgd) and by raw
PyTorch in this process, with torch threads 1 and 2, first on a quiet machine, then with
`--competitors N` busy processes (each a tight loop, one core's worth of work) running beside
it. Each configuration also runs with OMP_WAIT_POLICY=PASSIVE (OpenMP workers sleep at once
instead of spinning before they sleep), the setting that decides how a parallel region waits
for a worker the scheduler has taken away. Reps interleave loom and Python; the median of the
reps is reported (a loaded machine's figures scatter: the best rep hides the collapse).

  contention.py --loom-bin BIN --out JSON [--competitors 1] [--reps 5] [--steps 150]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fabric"))
from fabric_vs_loom import SIZES, write_inputs  # noqa: E402

PYTHON_SIDE = r"""
import sys, time, torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[4])
from fabric_vs_loom import SIZES, load_model
d, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
sizes, batch, batches, _, warmup = SIZES["medium"]
x = torch.from_file(d + "/x.bin", size=batches * batch * sizes[0]).view(batches, batch, sizes[0])
y = torch.from_file(d + "/y.bin", size=batches * batch, dtype=torch.int64).view(batches, batch)
m = load_model(d, sizes)
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, fused=True)
def step(i):
    loss = F.cross_entropy(m(x[i % batches]), y[i % batches])
    loss.backward()
    opt.step()
    opt.zero_grad()
for i in range(warmup):
    step(i)
t0 = time.perf_counter()
for i in range(steps):
    step(i)
print(steps / (time.perf_counter() - t0))
"""


def busy():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom-bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--competitors", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args()
    sizes, batch, batches, _, warmup = SIZES["medium"]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fabric")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        write_inputs(d, sizes, batch, batches)

        def loom(threads, env):
            cmd = [a.loom_bin, "--dir", d, "--sizes", ",".join(map(str, sizes)), "--batch",
                   str(batch), "--batches", str(batches), "--precision", "32-true", "--steps",
                   str(a.steps), "--warmup", str(warmup), "--reps", "1", "--threads",
                   str(threads), "--optimizer", "sgd"]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            return json.loads(out.stdout)["steps_per_s"][0]

        def python(threads, env):
            out = subprocess.run([sys.executable, "-c", PYTHON_SIDE, d, str(threads),
                                  str(a.steps), here], check=True, capture_output=True,
                                 text=True, env=env)
            return float(out.stdout)

        for load in (0, a.competitors):
            procs = [busy() for _ in range(load)]
            time.sleep(0.5)
            try:
                for threads in (1, 2):
                    for policy in ("default", "PASSIVE"):
                        env = dict(os.environ)
                        env.pop("OMP_WAIT_POLICY", None)
                        if policy != "default":
                            env["OMP_WAIT_POLICY"] = policy
                        rates = {"loom": [], "python": []}
                        for rep in range(a.reps):
                            for side in (("loom", "python") if rep % 2 == 0 else ("python", "loom")):
                                rates[side].append((loom if side == "loom" else python)(threads, env))
                        med = {k: statistics.median(v) for k, v in rates.items()}
                        row = {"competitors": load, "threads": threads, "wait_policy": policy,
                               "loom_steps_per_s": rates["loom"],
                               "python_steps_per_s": rates["python"],
                               "loom_median": med["loom"], "python_median": med["python"],
                               "loom_over_python": med["loom"] / med["python"]}
                        rows.append(row)
                        print(f"competitors {load} threads {threads} {policy:8s} loom "
                              f"{med['loom']:7.1f}  python {med['python']:7.1f}  "
                              f"x{row['loom_over_python']:.2f}  (loom {min(rates['loom']):.1f}-"
                              f"{max(rates['loom']):.1f}, python {min(rates['python']):.1f}-"
                              f"{max(rates['python']):.1f})", file=sys.stderr, flush=True)
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    with open(a.out, "w") as f:
        json.dump({"torch": torch.__version__, "cores": os.cpu_count(), "model": "medium",
                   "steps": a.steps, "reps": a.reps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
