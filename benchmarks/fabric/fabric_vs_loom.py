#!/usr/bin/env python3
"""loom against Lightning Fabric: the same MLP, initial weights, batches, optimizer (SGD,
lr 0.01, momentum 0.9), loss (cross-entropy) and step count, trained by Fabric in this process
and by loom in build/.../loom_fabric_train; steps/s of both and the largest absolute difference
of the final parameters.

  fabric_vs_loom.py --loom-bin BIN --out JSON [--device cpu] [--threads N]
                    [--sizes tiny,medium,large] [--precisions 32-true,bf16-mixed] [--reps 3]

Needs the `lightning` package (an opt-in benchmark dependency, never loom's):
  ~/.cache/loom/torch-<version>/bin/python -m pip install lightning
Both sides: torch threads = --threads, one batch list cycled, each step
  to_device(batch) -> forward -> cross_entropy -> backward -> optimizer step -> zero_grad.
This side writes the initial weights and the batches as raw files (init_<i>.bin f32 in
nn.Sequential parameter order, x.bin f32, y.bin i64) for the C++ side to read.
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

# name: (layer sizes, batch, batches, timed steps, warm-up steps); the steps keep each rep near
# a second on a 2-core CPU.
SIZES = {
    "tiny": ([32, 64, 64, 10], 32, 8, 600, 30),            # overhead-bound: ~50 kFLOP/step
    "medium": ([256, 512, 512, 10], 64, 8, 150, 10),         # ~150 MFLOP/step
    "large": ([1024, 2048, 2048, 10], 256, 4, 12, 2),        # compute-bound: ~10 GFLOP/step
}


def make_model(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def write_inputs(d, sizes, batch, batches):
    torch.manual_seed(0)
    model = make_model(sizes)
    for i, p in enumerate(model.parameters()):
        p.detach().contiguous().numpy().astype("<f4").tofile(os.path.join(d, f"init_{i}.bin"))
    x = torch.randn(batches, batch, sizes[0])
    y = torch.randint(0, sizes[-1], (batches, batch))
    x.numpy().astype("<f4").tofile(os.path.join(d, "x.bin"))
    y.numpy().astype("<i8").tofile(os.path.join(d, "y.bin"))
    return x, y


def load_model(d, sizes):
    model = make_model(sizes)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.from_file(os.path.join(d, f"init_{i}.bin"), size=p.numel(),
                                    dtype=torch.float32).view_as(p))
    return model


def fabric_train(d, cfg, precision, device, x, y):
    """One rep: steps/s and the final parameters."""
    from lightning.fabric import Fabric

    sizes, _, batches, steps, warmup = cfg
    xs = [x[i].clone() for i in range(batches)]
    ys = [y[i].clone() for i in range(batches)]
    if True:
        fabric = Fabric(accelerator=device, devices=1, precision=precision)
        model = load_model(d, sizes)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        model, opt = fabric.setup(model, opt)

        def step(i):
            xb, yb = fabric.to_device((xs[i % batches], ys[i % batches]))
            out = model(xb)
            loss = F.cross_entropy(out, yb)
            fabric.backward(loss)
            opt.step()
            opt.zero_grad()

        i = 0
        for _ in range(warmup):
            step(i)
            i += 1
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(i)
            i += 1
        if device == "cuda":
            torch.cuda.synchronize()
        rate = steps / (time.perf_counter() - t0)
    final = [p.detach().float().cpu() for p in model.parameters()]
    return rate, final


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom-bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--sizes", default="tiny,medium,large")
    ap.add_argument("--precisions", default="32-true,bf16-mixed")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()

    warnings.filterwarnings("ignore")
    torch.set_num_threads(a.threads)
    import lightning

    results = []
    for size in a.sizes.split(","):
        cfg = SIZES[size]
        sizes, batch, batches, steps, warmup = cfg
        for precision in a.precisions.split(","):
            with tempfile.TemporaryDirectory() as d:
                x, y = write_inputs(d, sizes, batch, batches)
                reps = a.reps if size != "large" else max(1, a.reps - 1)
                cmd = [a.loom_bin, "--dir", d, "--sizes", ",".join(map(str, sizes)),
                       "--batch", str(batch), "--batches", str(batches), "--precision", precision,
                       "--steps", str(steps), "--warmup", str(warmup), "--reps", "1",
                       "--threads", str(a.threads), "--device", a.device]
                l_rates, f_rates = [], []
                for rep in range(reps):
                    # Interleaved, and the order alternates, so that neither side always runs
                    # on a quieter machine.
                    for side in (("loom", "fabric") if rep % 2 == 0 else ("fabric", "loom")):
                        if side == "loom":
                            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
                            l_rates += json.loads(out.stdout)["steps_per_s"]
                        else:
                            rate, final = fabric_train(d, cfg, precision, a.device, x, y)
                            f_rates.append(rate)
                diff = 0.0
                for i, p in enumerate(final):
                    q = torch.from_file(os.path.join(d, f"loom_final_{i}.bin"), size=p.numel(),
                                        dtype=torch.float32).view_as(p)
                    diff = max(diff, (p.double() - q.double()).abs().max().item())
            row = {
                "size": size, "layers": sizes, "batch": batch, "precision": precision,
                "device": a.device, "steps": steps, "warmup": warmup, "reps": reps,
                "fabric_steps_per_s": f_rates, "loom_steps_per_s": l_rates,
                "fabric_best": max(f_rates), "loom_best": max(l_rates),
                "speedup": max(l_rates) / max(f_rates),
                "max_abs_param_diff": diff,
            }
            results.append(row)
            print(f"{size:6s} {precision:10s} loom {row['loom_best']:9.1f} steps/s  fabric "
                  f"{row['fabric_best']:9.1f} steps/s  x{row['speedup']:.2f}  max|dp| {diff:.3g}",
                  file=sys.stderr, flush=True)
    doc = {"threads": a.threads, "torch": torch.__version__, "lightning": lightning.__version__,
           "optimizer": "SGD(lr=0.01, momentum=0.9)", "loss": "cross_entropy",
           "results": results}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
