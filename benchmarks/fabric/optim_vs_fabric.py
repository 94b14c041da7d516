#!/usr/bin/env python3
"""loom's fused optimizers against Lightning Fabric's: the MLPs, weights and batches of
fabric_vs_loom.py, trained by loom (loom_fabric_train --optimizer sgd|adam: loom::optim's fused
SGD or Adam) and by Fabric twice, with the optimizer's default (the single-tensor loop on the
CPU, what a Fabric user gets) and with fused=True (the best a Python user can do). SGD(lr=0.01,
momentum=0.9) and Adam(lr=1e-3); 32-true and bf16-mixed; torch threads 1 and 2. Steps/s of the
three, interleaved (the order rotates every rep), best of the reps, and the largest absolute
difference between loom's final parameters and Fabric-fused's.

  optim_vs_fabric.py --loom-bin BIN --out JSON [--threads 1,2] [--sizes tiny,medium,large]
                     [--precisions 32-true,bf16-mixed] [--optimizers sgd,adam] [--reps 3]

Large bf16-mixed is left out: on a CPU without native bf16 (no AVX-512 BF16 or AMX) one run of
its 14 steps takes minutes, and Fabric's and loom's steps are the same bf16 GEMMs (part 5).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fabric_vs_loom import SIZES, load_model, write_inputs  # noqa: E402


def make_optimizer(name, params, fused):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=fused or None)
    return torch.optim.Adam(params, lr=1e-3, fused=fused or None)


def fabric_train(d, cfg, precision, x, y, optimizer, fused):
    from lightning.fabric import Fabric

    sizes, _, batches, steps, warmup = cfg
    xs = [x[i].clone() for i in range(batches)]
    ys = [y[i].clone() for i in range(batches)]
    fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
    model = load_model(d, sizes)
    opt = make_optimizer(optimizer, model.parameters(), fused)
    model, opt = fabric.setup(model, opt)

    def step(i):
        xb, yb = fabric.to_device((xs[i % batches], ys[i % batches]))
        loss = F.cross_entropy(model(xb), yb)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()

    for i in range(warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    rate = steps / (time.perf_counter() - t0)
    return rate, [p.detach().float() for p in model.parameters()]


def write(path, rows):
    import lightning

    doc = {"torch": torch.__version__, "lightning": lightning.__version__,
           "optimizers": {"sgd": "SGD(lr=0.01, momentum=0.9)", "adam": "Adam(lr=1e-3)"},
           "loss": "cross_entropy", "rows": rows}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom-bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--sizes", default="tiny,medium,large")
    ap.add_argument("--precisions", default="32-true,bf16-mixed")
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        for size in a.sizes.split(","):
            cfg = SIZES[size]
            sizes, batch, batches, steps, warmup = cfg
            for precision in a.precisions.split(","):
                if size == "large" and precision == "bf16-mixed":
                    continue
                for optimizer in a.optimizers.split(","):
                    with tempfile.TemporaryDirectory() as d:
                        x, y = write_inputs(d, sizes, batch, batches)
                        reps = a.reps if size != "large" else max(1, a.reps - 1)
                        cmd = [a.loom_bin, "--dir", d, "--sizes", ",".join(map(str, sizes)),
                               "--batch", str(batch), "--batches", str(batches),
                               "--precision", precision, "--steps", str(steps), "--warmup",
                               str(warmup), "--reps", "1", "--threads", str(threads),
                               "--optimizer", optimizer]
                        rates = {"loom": [], "default": [], "fused": []}
                        sides = ["loom", "default", "fused"]
                        for rep in range(reps):
                            for side in sides[rep % 3:] + sides[:rep % 3]:
                                if side == "loom":
                                    out = subprocess.run(cmd, check=True, capture_output=True,
                                                         text=True)
                                    rates["loom"] += json.loads(out.stdout)["steps_per_s"]
                                else:
                                    rate, final = fabric_train(d, cfg, precision, x, y, optimizer,
                                                               side == "fused")
                                    rates[side].append(rate)
                                    if side == "fused":
                                        fused_final = final
                        diff = 0.0
                        for i, p in enumerate(fused_final):
                            q = torch.from_file(os.path.join(d, f"loom_final_{i}.bin"),
                                                size=p.numel(), dtype=torch.float32).view_as(p)
                            diff = max(diff, (p.double() - q.double()).abs().max().item())
                    best = {k: max(v) for k, v in rates.items()}
                    row = {"threads": threads, "size": size, "layers": sizes, "batch": batch,
                           "precision": precision, "optimizer": optimizer, "steps": steps,
                           "reps": reps, "loom_steps_per_s": rates["loom"],
                           "fabric_default_steps_per_s": rates["default"],
                           "fabric_fused_steps_per_s": rates["fused"],
                           "loom_best": best["loom"], "fabric_default_best": best["default"],
                           "fabric_fused_best": best["fused"],
                           "vs_default": best["loom"] / best["default"],
                           "vs_fused": best["loom"] / best["fused"],
                           "max_abs_param_diff_vs_fused": diff}
                    rows.append(row)
                    write(a.out, rows)  # after every row: a stopped run keeps what it measured
                    print(f"t{threads} {size:6s} {precision:10s} {optimizer:4s} loom "
                          f"{best['loom']:8.1f}  fabric {best['default']:8.1f} (x{row['vs_default']:.2f})"
                          f"  fabric-fused {best['fused']:8.1f} (x{row['vs_fused']:.2f})"
                          f"  max|dp| {diff:.3g}", file=sys.stderr, flush=True)
    write(a.out, rows)


if __name__ == "__main__":
    main()
