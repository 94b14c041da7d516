"""Parity of loom::Ddp with torch.nn.parallel.DistributedDataParallel.

The same model (an MLP 8-16-4), initial weights, data, DistributedSampler, SGD and steps,
trained by Python's DDP (gloo, 2 ranks, torchrun) and by loom::Ddp (tests/dist/worker.cpp,
mode parity, through `torchrun --no-python`), in 32-true and bf16-mixed; then every rank's
final parameters are compared bit for bit, with Python's and across ranks. Then gradient
accumulation: each batch cut into 4 micro-batches (tensor_split), the first 3 backwards under
DDP's no_sync() (loom: rt.no_backward_sync), the loss divided by 4, one step; in 32-true,
bf16-mixed and 16-mixed (a GradScaler with growth_interval 3 on both sides, whose scale and
growth tracker must be equal too). Then static_graph=True on a model with a layer that no
forward uses. Last, the communication hooks: c10d's builtin FP16_COMPRESS, Python's
bf16_compress_hook (loom's own copy of its arithmetic) and a user's hook (loom: a
c10d::CppCommHookInterface; Python: default_hooks.allreduce_hook). And uneven inputs: rank 0
stops after 10 of its 12 steps inside join() (loom: rt.strategy().join()).

Usage: python ddp_parity.py --worker BIN --dir DIR     (the driver)
       torchrun ... ddp_parity.py --role python --dir DIR --precision P   (Python's side)
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from launch import torchrun

SAMPLES, EPOCHS, BATCH, WORLD = 96, 2, 8, 2
# (precision, micro-batches per step, static_graph with a layer no forward uses, comm hook,
#  join: rank 0 stops after JOIN_STEPS of its 12 steps, inside DDP's join())
RUNS = [("32-true", 1, False, "none", False), ("bf16-mixed", 1, False, "none", False),
        ("32-true", 4, False, "none", False), ("bf16-mixed", 4, False, "none", False),
        ("16-mixed", 4, False, "none", False), ("32-true", 1, True, "none", False),
        ("32-true", 1, False, "fp16", False), ("32-true", 4, False, "bf16", False),
        ("bf16-mixed", 1, False, "user", False), ("32-true", 1, False, "none", True)]
JOIN_STEPS = 10
GROWTH_INTERVAL = 3  # 16-mixed: the scale grows (and backs off) within the run


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


class WithUnused(torch.nn.Module):
    """The MLP and a layer no forward uses (loom: a module registered on the Sequential)."""

    def __init__(self):
        super().__init__()
        self.net = mlp()
        self.unused = torch.nn.Linear(4, 4)
        with torch.no_grad():
            for p in self.unused.parameters():
                p.fill_(0.5)

    def forward(self, x):
        return self.net(x)


def write_inputs(d):
    torch.manual_seed(1234)
    model = mlp()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / "init.bin")
    torch.randn(SAMPLES, 8).numpy().astype("<f4").tofile(d / "x.bin")
    torch.randint(0, 4, (SAMPLES,)).numpy().astype("<i8").tofile(d / "y.bin")


def python_side(d, precision, accumulate, static_graph, hook, join):
    import contextlib

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = WithUnused() if static_graph else mlp()
    init = torch.from_numpy(np.fromfile(d / "init.bin", dtype="<f4"))
    with torch.no_grad():
        at = 0
        for p in (model.net if static_graph else model).parameters():
            p.copy_(init[at:at + p.numel()].reshape(p.shape))
            at += p.numel()
    x = torch.from_numpy(np.fromfile(d / "x.bin", dtype="<f4").reshape(SAMPLES, 8))
    y = torch.from_numpy(np.fromfile(d / "y.bin", dtype="<i8"))
    ddp = DDP(model, static_graph=static_graph)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    if hook == "fp16":
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    elif hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "user":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    scaler = (torch.amp.GradScaler("cpu", growth_interval=GROWTH_INTERVAL)
              if precision == "16-mixed" else None)
    low = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    sampler = DistributedSampler(range(SAMPLES), num_replicas=world, rank=rank, shuffle=True,
                                 seed=0)
    def batches():
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            idx = list(sampler)
            for i in range(0, len(idx), BATCH):
                yield torch.tensor(idx[i:i + BATCH])

    steps = JOIN_STEPS if join and rank == 0 else None  # uneven inputs: rank 0 has fewer
    with ddp.join() if join else contextlib.nullcontext():
        for step, b in enumerate(batches()):
            if step == steps:
                break
            opt.zero_grad()
            xs, ys = x[b].tensor_split(accumulate), y[b].tensor_split(accumulate)
            for j in range(accumulate):
                last = j == accumulate - 1
                with contextlib.nullcontext() if last else ddp.no_sync():
                    if low is not None:  # as loom and Fabric do: low-precision inputs, fp32 output
                        with torch.autocast("cpu", dtype=low):
                            out = ddp(xs[j].to(low))
                        out = out.float()
                    else:
                        out = ddp(xs[j])
                    loss = torch.nn.functional.cross_entropy(out, ys[j])
                    if accumulate > 1:
                        loss = loss / accumulate
                    (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / f"python_rank{rank}.bin")
    if scaler:
        (d / f"python_rank{rank}.scaler").write_text(
            f"{scaler.get_scale()} {scaler._get_growth_tracker()}")
    dist.barrier()
    dist.destroy_process_group()


def run(*cmd, attempts=1):
    torchrun(list(cmd), WORLD, " ".join(cmd[:3]), attempts, test="ddp_parity")


def driver(worker, d):
    d.mkdir(parents=True, exist_ok=True)
    write_inputs(d)
    finals = {}
    for precision, k, static, hook, join in RUNS:
        for f in list(d.glob("*_rank*.bin")) + list(d.glob("*_rank*.scaler")):
            f.unlink()
        # Python's own DDP is the reference: a rare crash of stock torch's gloo ranks ("terminate
        # called without an active exception", SIGABRT) is not loom's, so its side gets a
        # second attempt; loom's side gets one.
        run(__file__, "--role", "python", "--dir", str(d), "--precision", precision,
                 "--accumulate", str(k), "--comm-hook", hook, *(["--static-graph"] if static else []),
                 *(["--join"] if join else []), attempts=2)
        run("--no-python", worker, "parity", f"dir={d}", f"precision={precision}",
                 f"samples={SAMPLES}", f"epochs={EPOCHS}", f"batch={BATCH}", f"accumulate={k}",
                 f"growth_interval={GROWTH_INTERVAL}", f"static_graph={int(static)}",
                 f"unused={int(static)}", f"comm_hook={hook}",
                 f"join_steps={JOIN_STEPS if join else -1}")
        py = [np.fromfile(d / f"python_rank{r}.bin", dtype="<f4") for r in range(WORLD)]
        lm = [np.fromfile(d / f"loom_rank{r}.bin", dtype="<f4") for r in range(WORLD)]
        diff = max(float(np.abs(a - b).max()) for a, b in zip(py, lm))
        bitwise = all(np.array_equal(a.view("<u4"), b.view("<u4")) for a, b in zip(py, lm))
        ranks_equal = all(np.array_equal(lm[0], b) for b in lm[1:])
        init = np.fromfile(d / "init.bin", dtype="<f4")
        moved = float(np.abs(lm[0][:init.size] - init).max())
        if static and not np.all(lm[0][init.size:] == 0.5):
            raise SystemExit("ddp_parity: the layer no forward uses changed")
        what = precision if k == 1 else f"{precision}, {k} micro-batches (no_sync)"
        if static:
            what += ", static_graph with a layer no forward uses"
        if hook != "none":
            what += f", comm hook {hook}"
        if join:
            what += f", join() with {JOIN_STEPS} and 12 steps on the ranks"
        scaler = ""
        scaler_equal = True
        if precision == "16-mixed":
            ps = [tuple(map(float, (d / f"python_rank{r}.scaler").read_text().split()))
                  for r in range(WORLD)]
            ls = [tuple(map(float, (d / f"loom_rank{r}.scaler").read_text().split()))
                  for r in range(WORLD)]
            scaler_equal = ps == ls
            scaler = (f", scaler (scale, growth tracker) loom {ls[0]} Python {ps[0]}: "
                      f"{'equal' if scaler_equal else 'NOT equal'}")
        print(f"ddp parity {what}: {lm[0].size} parameters, {WORLD} ranks, "
              f"loom vs Python max|diff| {diff:g} ({'bitwise equal' if bitwise else 'NOT bitwise'}), "
              f"ranks equal: {ranks_equal}, moved from init by up to {moved:.3g}{scaler}")
        if not (bitwise and ranks_equal and moved > 0 and scaler_equal):
            raise SystemExit(f"ddp_parity: {what} differs from Python's DDP")
        finals[(precision, k, static, hook, join)] = lm[0]
    # The variants really differ: bf16 autocast changes the result; so do accumulation and the
    # compressing hooks (a user's hook with the reducer's arithmetic does not).
    def differ(a, b, why):
        if np.array_equal(finals[a], finals[b]):
            raise SystemExit(f"ddp_parity: {why}")
        return float(np.abs(finals[a] - finals[b]).max())
    plain, bf16 = ("32-true", 1, False, "none", False), ("bf16-mixed", 1, False, "none", False)
    d_bf16 = differ(plain, bf16, "bf16-mixed gave the 32-true result; autocast did not run")
    differ(plain, ("32-true", 4, False, "none", False), "4 micro-batches gave the 1-batch result")
    d_fp16 = differ(plain, ("32-true", 1, False, "fp16", False), "the fp16 hook changed nothing")
    d_bhook = differ(("32-true", 4, False, "none", False), ("32-true", 4, False, "bf16", False),
                     "the bf16 hook changed nothing")
    differ(plain, ("32-true", 1, False, "none", True), "join gave the even run's result")
    if not np.array_equal(finals[bf16], finals[("bf16-mixed", 1, False, "user", False)]):
        raise SystemExit("ddp_parity: the user's all-reduce hook differs from the reducer's")
    print(f"ddp parity: bf16-mixed and 32-true differ by up to {d_bf16:.3g}; the fp16 hook "
          f"moves 32-true by up to {d_fp16:.3g}, the bf16 hook (4 micro-batches) by {d_bhook:.3g}; "
          "the user's all-reduce hook equals the default bit for bit")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="driver")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--worker")
    ap.add_argument("--precision", default="32-true")
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--static-graph", action="store_true")
    ap.add_argument("--comm-hook", default="none")
    ap.add_argument("--join", action="store_true")
    a = ap.parse_args()
    d = Path(a.dir).resolve()
    if a.role == "python":
        python_side(d, a.precision, a.accumulate, a.static_graph, a.comm_hook, a.join)
    else:
        driver(a.worker, d)


if __name__ == "__main__":
    main()
