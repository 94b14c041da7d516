"""Parity of loom::Fsdp with Python's FSDP2 (fully_shard) on 2 ranks (gloo, torchrun).

The same model (Linear 8-15, Tanh, LayerNorm, Linear 15-32, Tanh, Linear 32-15, LayerNorm,
Linear 15-5: row counts 15 and 5 leave the last rank's pieces padded), initial weights and
data, trained 20 steps with fused AdamW (lr 1e-2, weight decay 0.01) by Python's
fully_shard(model) (the root as the one unit) + torch.optim.AdamW(fused=True), and by loom
(tests/dist/fsdp_worker.cpp) under loom::Fsdp. Step i trains on rows [8i, 8i + 8), each rank
its half. Cases: 32-true; 4 micro-batches (Python: set_requires_gradient_sync(False) on all
but the last; loom: no_backward_sync); the gradient norm clipped to 0.5 (norms compared step
by step). Each must equal Python bit for bit: the whole parameters after the last step and,
clipped, every step's norm.

loom::Ddp on the same run is reported beside it, not required to be equal: its fused AdamW
steps the whole parameters, whose kernel splits the work by tensor size, so its roundings may
differ from those of the pieces (where they agree the line says so).

Usage: python fsdp_parity.py --worker BIN --dir DIR     (the driver)
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from launch import torchrun

STEPS, GLOBAL, WORLD = 20, 8, 2
SAMPLES = STEPS * GLOBAL
LR, WD = 1e-2, 0.01
RUNS = [(1, 0.0), (4, 0.0), (1, 0.5)]  # (micro-batches, clip)


def model_():
    return torch.nn.Sequential(torch.nn.Linear(8, 15), torch.nn.Tanh(), torch.nn.LayerNorm(15),
                               torch.nn.Linear(15, 32), torch.nn.Tanh(), torch.nn.Linear(32, 15),
                               torch.nn.LayerNorm(15), torch.nn.Linear(15, 5))


def write_inputs(d):
    torch.manual_seed(1234)
    model = model_()
    with torch.no_grad():  # LayerNorm's ones and zeros moved, so its pieces differ too
        for p in model.parameters():
            p.add_(torch.randn_like(p).mul(0.1))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / "init.bin")
    torch.randn(SAMPLES, 8).mul(3).numpy().astype("<f4").tofile(d / "x.bin")
    torch.randint(0, 5, (SAMPLES,)).numpy().astype("<i8").tofile(d / "y.bin")


def load(d):
    model = model_()
    init = torch.from_numpy(np.fromfile(d / "init.bin", dtype="<f4"))
    with torch.no_grad():
        at = 0
        for p in model.parameters():
            p.copy_(init[at:at + p.numel()].reshape(p.shape))
            at += p.numel()
    x = torch.from_numpy(np.fromfile(d / "x.bin", dtype="<f4").reshape(SAMPLES, 8))
    y = torch.from_numpy(np.fromfile(d / "y.bin", dtype="<i8"))
    return model, x, y


def python_side(d, accumulate, clip):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, y = load(d)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, fused=True)
    per = GLOBAL // world
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        rows = slice(step * GLOBAL + rank * per, step * GLOBAL + (rank + 1) * per)
        xs, ys = x[rows].tensor_split(accumulate), y[rows].tensor_split(accumulate)
        for j in range(accumulate):
            model.set_requires_gradient_sync(j == accumulate - 1)
            loss = torch.nn.functional.cross_entropy(model(xs[j]), ys[j])
            (loss / accumulate if accumulate > 1 else loss).backward()
        if clip > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
    flat = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / f"python_rank{rank}.bin")
    if clip > 0:
        (d / f"python_rank{rank}.norms").write_text("".join(f"{n!r}\n" for n in norms))
    dist.barrier()
    dist.destroy_process_group()


def ranks(d, tag):
    return [np.fromfile(d / f"{tag}_rank{r}.bin", dtype="<f4") for r in range(WORLD)]


def norms(d, tag):
    return [[float(v) for v in (d / f"{tag}_rank{r}.norms").read_text().split()]
            for r in range(WORLD)]


def bitwise(a, b):
    return all(np.array_equal(x.view("<u4"), y.view("<u4")) for x, y in zip(a, b))


def maxdiff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def driver(worker, d):
    d.mkdir(parents=True, exist_ok=True)
    write_inputs(d)
    init = np.fromfile(d / "init.bin", dtype="<f4")
    for k, clip in RUNS:
        for f in [f for ext in ("bin", "norms") for f in d.glob(f"*_rank*.{ext}")]:
            f.unlink()
        what = "32-true" + (f", {k} micro-batches" if k > 1 else "") + \
            (f", clip {clip}" if clip else "")
        torchrun([__file__, "--role", "python", "--dir", str(d), "--accumulate", str(k),
                  "--clip", str(clip)], WORLD, f"Python FSDP2 ({what})", attempts=3,
                 test="fsdp_parity")
        py = ranks(d, "python")
        if not bitwise(py[:1], py[1:]):
            raise SystemExit(f"fsdp_parity: Python's ranks differ ({what})")
        for strategy in ("fsdp", "ddp"):
            torchrun(["--no-python", worker, f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}",
                      f"accumulate={k}", f"clip={clip}", f"strategy={strategy}",
                      f"tag={strategy}"], WORLD, f"loom {strategy} ({what})",
                     test="fsdp_parity")
            lm = ranks(d, strategy)
            same = bitwise(py, lm)
            line = (f"fsdp parity {what}: loom {strategy} vs Python fully_shard max|diff| "
                    f"{maxdiff(py, lm):g} ({'bitwise equal' if same else 'NOT bitwise'}), "
                    f"moved from init by {float(np.abs(lm[0] - init).max()):.3g}")
            if clip:
                pn, ln = norms(d, "python"), norms(d, strategy)
                equal = pn == ln
                active = sum(n > clip for n in pn[0])
                line += (f"; norms {'bitwise equal' if equal else 'NOT equal'} at each of "
                         f"{STEPS} steps, clipping active on {active}")
                if strategy == "fsdp" and (not equal or active == 0):
                    print(line)
                    raise SystemExit(f"fsdp_parity: loom fsdp's norms ({what}) are not "
                                     f"Python's, or clipping never acted")
            print(line)
            if strategy == "fsdp" and not same:
                raise SystemExit(f"fsdp_parity: loom fsdp ({what}) differs from Python's FSDP2")
            if not bitwise(lm[:1], lm[1:]):
                raise SystemExit(f"fsdp_parity: loom {strategy}'s ranks differ ({what})")
    print("dist fsdp: ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="driver")
    ap.add_argument("--worker")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--clip", type=float, default=0.0)
    a = ap.parse_args()
    d = Path(a.dir)
    if a.role == "python":
        python_side(d, a.accumulate, a.clip)
    else:
        driver(a.worker, d)


if __name__ == "__main__":
    sys.exit(main())
