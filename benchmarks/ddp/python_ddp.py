"""Python's side of the DDP benchmark (ddp_vs_python.py): one rank of the same MLP trained by
torch.nn.parallel.DistributedDataParallel (gloo), started by torchrun, one thread per rank.

Usage: torchrun --nproc-per-node=2 python_ddp.py --sizes 32,64,64,10 --batch 32 --steps 600
                --warmup 30 --precision 32-true
Rank 0 prints one JSON object: {"mode": "ddp", "steps_per_s", "ms_per_step"}.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="32,64,64,10")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    model = DDP(torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs = [torch.randn(a.batch, sizes[0]) for _ in range(8)]
    ys = [torch.randint(0, sizes[-1], (a.batch,)) for _ in range(8)]
    mixed = a.precision == "bf16-mixed"

    def step(i):
        x = xs[i % 8]
        if mixed:  # as loom and Fabric: bf16 inputs under autocast, the output back in fp32
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x.to(torch.bfloat16))
            out = out.float()
        else:
            out = model(x)
        loss = F.cross_entropy(out, ys[i % 8])
        opt.zero_grad()
        loss.backward()
        opt.step()

    for i in range(a.warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(i)
    dist.barrier()
    secs = time.perf_counter() - t0
    if dist.get_rank() == 0:
        print(json.dumps({"mode": "ddp", "steps_per_s": a.steps / secs,
                          "ms_per_step": 1000 * secs / a.steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
