"""Python's side of the DDP benchmark (ddp_vs_python.py): one rank of the same MLP trained by
torch.nn.parallel.DistributedDataParallel (gloo), started by torchrun, one thread per rank.

Usage: torchrun --nproc-per-node=2 python_ddp.py --sizes 32,64,64,10 --batch 32 --steps 600
                --warmup 30 --precision 32-true [--mode ddp|nosync] [--accumulate K]
                [--comm-hook none|fp16|bf16] [--pin]
nosync: every backward under DDP's no_sync(); --accumulate K: K micro-batches (tensor_split),
the first K - 1 under no_sync(); hooks: _register_builtin_comm_hook(FP16_COMPRESS) and
register_comm_hook(None, bf16_compress_hook); --pin: this rank on its half of the cores.
Rank 0 prints one JSON object: {"mode", "steps_per_s", "ms_per_step"}.
"""

import argparse
import contextlib
import json
import os
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
    ap.add_argument("--mode", default="ddp", choices=["ddp", "nosync"])
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--comm-hook", default="none", choices=["none", "fp16", "bf16"])
    ap.add_argument("--pin", action="store_true")
    a = ap.parse_args()
    if a.pin:
        cores = os.cpu_count()
        share = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "2")))
        r = int(os.environ.get("LOCAL_RANK", "0"))
        os.sched_setaffinity(0, range(r * share, min(cores, (r + 1) * share)))
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
    if a.comm_hook == "fp16":
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    elif a.comm_hook == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs = [torch.randn(a.batch, sizes[0]) for _ in range(8)]
    ys = [torch.randint(0, sizes[-1], (a.batch,)) for _ in range(8)]
    mixed = a.precision == "bf16-mixed"

    def forward_backward(x, y, scale):
        if mixed:  # as loom and Fabric: bf16 inputs under autocast, the output back in fp32
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x.to(torch.bfloat16))
            out = out.float()
        else:
            out = model(x)
        loss = F.cross_entropy(out, y)
        (loss / scale if scale > 1 else loss).backward()

    k, nosync = a.accumulate, a.mode == "nosync"

    def step(i):
        opt.zero_grad()
        if k == 1:
            with model.no_sync() if nosync else contextlib.nullcontext():
                forward_backward(xs[i % 8], ys[i % 8], 1)
        else:
            for j, (x, y) in enumerate(zip(xs[i % 8].tensor_split(k), ys[i % 8].tensor_split(k))):
                with model.no_sync() if nosync or j + 1 < k else contextlib.nullcontext():
                    forward_backward(x, y, k)
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
        print(json.dumps({"mode": a.mode, "steps_per_s": a.steps / secs,
                          "ms_per_step": 1000 * secs / a.steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
