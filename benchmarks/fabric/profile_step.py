#!/usr/bin/env python3
"""Where one tiny-MLP training step's time goes: the per-op profile behind part 7's ratios.

Runs Fabric's step (tiny MLP of fabric_vs_loom.py, the fused optimizer, one torch thread) under
torch.profiler and prints, per precision and optimizer: the step's wall time with and without
the profiler, the ATen ops of one step by self CPU time (count and microseconds), and how the
step splits into time inside ATen ops and Python's own time around them. loom runs the same ATen
ops with no Python around them (docs/benchmarks.md part 2: its step executes the instructions
of hand-written LibTorch), so the ATen time bounds loom's step from below and
(Python's step) / (ATen time) bounds the loom/Fabric ratio from above.

  profile_step.py [--precisions 32-true,bf16-mixed] [--optimizers sgd,adam] [--steps 200]
"""
import argparse
import os
import sys
import tempfile
import time
import warnings
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fabric_vs_loom import SIZES, load_model, write_inputs  # noqa: E402
from optim_vs_fabric import make_optimizer  # noqa: E402


CXX_PREFIXES = ("aten::", "autograd::", "torch::autograd::")


def fabric_step(d, precision, optimizer, x, y):
    from lightning.fabric import Fabric

    sizes, _, batches, _, _ = SIZES["tiny"]
    fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
    model = load_model(d, sizes)
    opt = make_optimizer(optimizer, model.parameters(), fused=True)
    model, opt = fabric.setup(model, opt)

    def step(i):
        xb, yb = fabric.to_device((x[i % batches], y[i % batches]))
        loss = F.cross_entropy(model(xb), yb)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="32-true,bf16-mixed")
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    sizes, batch, batches, _, _ = SIZES["tiny"]
    with tempfile.TemporaryDirectory() as d:
        x, y = write_inputs(d, sizes, batch, batches)
        for precision in a.precisions.split(","):
            for optimizer in a.optimizers.split(","):
                step = fabric_step(d, precision, optimizer, x, y)
                for i in range(50):
                    step(i)
                t0 = time.perf_counter()
                for i in range(a.steps):
                    step(i)
                plain_us = (time.perf_counter() - t0) / a.steps * 1e6
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    t0 = time.perf_counter()
                    for i in range(a.steps):
                        step(i)
                    prof_us = (time.perf_counter() - t0) / a.steps * 1e6
                self_us, calls = defaultdict(float), defaultdict(int)
                for e in prof.key_averages():
                    self_us[e.key] += e.self_cpu_time_total / a.steps
                    calls[e.key] += e.count // a.steps
                # C++ work, which loom's step does too: ATen ops and the autograd engine's
                # nodes. The rest (Python's record_function scopes such as
                # "Optimizer.step#SGD.step") have Python's own time as their self time.
                cxx = {k: v for k, v in self_us.items() if k.startswith(CXX_PREFIXES)}
                aten_us = sum(cxx.values())
                print(f"\n#### tiny, {precision}, {optimizer} (fused), 1 thread\n")
                print(f"- Fabric step: {plain_us:.1f} us ({prof_us:.1f} us profiled); "
                      f"inside ATen ops and autograd nodes (self CPU, summed): {aten_us:.1f} us; "
                      f"Python around them: {prof_us - aten_us:.1f} us")
                print(f"- ceiling of loom/Fabric if loom's step = the ATen time: "
                      f"{prof_us / aten_us:.2f}x (profiled times)\n")
                print("| op | calls/step | self us/step |")
                print("|---|---:|---:|")
                top = sorted(cxx.items(), key=lambda kv: -kv[1])[:a.top]
                for k, v in top:
                    print(f"| `{k}` | {calls[k]} | {v:.1f} |")
                n_ops = sum(calls[k] for k in cxx)
                print(f"| all {len(cxx)} kinds | {n_ops} | {aten_us:.1f} |")


if __name__ == "__main__":
    main()
