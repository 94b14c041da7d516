"""Python's FSDP2 on loom_bench_zero's model (benchmarks/memory/zero.cpp), for the step time
beside loom::Fsdp's: Linear(width, width) x layers with Tanh between them, fully_shard on each
Linear and then on the model, torch.optim.AdamW(fused=True), one compute thread per rank, the
median step of --steps after 2 warm-ups, each step timed from a barrier as loom's is. Rank 0
prints one JSON line.

Usage: torchrun --standalone --nproc-per-node=2 fsdp_python.py [--layers 8] [--width 1600]
                [--batch 32] [--steps 12]
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=12)
    a, _ = ap.parse_known_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = []
    for i in range(a.layers):
        if i:
            layers.append(torch.nn.Tanh())
        layers.append(torch.nn.Linear(a.width, a.width))
    model = torch.nn.Sequential(*layers)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    torch.manual_seed(1 + rank)
    x, y = torch.randn(a.batch, a.width), torch.randn(a.batch, a.width)
    times = []
    for i in range(a.steps + 2):
        opt.zero_grad()
        dist.barrier()
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if i >= 2:
            times.append((t1 - t0) * 1000)
    times.sort()
    if rank == 0:
        print(json.dumps({"strategy": "python_fsdp2", "world": world,
                          "step_ms": times[len(times) // 2]}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
