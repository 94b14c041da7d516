"""Checks what `quickstart --log-dir DIR --max-steps N` logged (examples/CMakeLists.txt).

  python check_logs.py DIR/quickstart N

In the newest version_K: metrics.csv, read by Python's csv module, holds the loss of steps
0..N-1 (finite, positive), the lr, SpeedMonitor's throughput under Composer's names once its
window is full, and MemoryMonitor's CPU memory; hparams.yaml holds the run's settings.
"""

import csv
import math
import os
import sys


def main(root, n):
    versions = sorted((d for d in os.listdir(root) if d.startswith("version_")),
                      key=lambda d: int(d.split("_")[1]))
    run = os.path.join(root, versions[-1])
    with open(os.path.join(run, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    losses = {int(r["step"]): float(r["train/loss"]) for r in rows if r["train/loss"]}
    if sorted(losses) != list(range(n)):
        raise AssertionError(f"loss logged at steps {sorted(losses)}, expected 0..{n - 1}")
    if not all(math.isfinite(v) and v > 0 for v in losses.values()):
        raise AssertionError("a loss is not finite and positive")
    speed = [float(r["throughput/samples_per_sec"]) for r in rows
             if r.get("throughput/samples_per_sec")]
    if len(speed) != n - 20 or min(speed) <= 0:  # logged once 21 steps are in (window 20)
        raise AssertionError(f"{len(speed)} throughput values, expected {n - 20}")
    rss = [float(r["memory/cpu_rss_mem"]) for r in rows if r.get("memory/cpu_rss_mem")]
    if not rss or min(rss) <= 0:
        raise AssertionError("no CPU memory logged")
    with open(os.path.join(run, "hparams.yaml")) as f:
        hparams = f.read()
    if "precision: 32-true" not in hparams or "batch_size: 64" not in hparams:
        raise AssertionError(f"hparams.yaml: {hparams!r}")
    print(f"{run}: {len(losses)} losses, {len(speed)} throughputs "
          f"(last {speed[-1]:.0f} samples/s), {len(rss)} memory rows read back")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
