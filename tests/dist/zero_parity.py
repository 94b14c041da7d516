"""Parity of loom::Zero with Python's ZeroRedundancyOptimizer, and its checkpoints.

The same MLP 8-32-32-4, initial weights and data, trained 20 steps with fused AdamW (lr 1e-2,
weight decay 0.01, StepLR halving the lr every 6 steps) on 2 ranks (gloo, torchrun): by Python's DistributedDataParallel +
ZeroRedundancyOptimizer(AdamW, fused=True), and by loom (tests/dist/worker.cpp, mode zero)
under loom::Zero stage 1, stage 2 (buckets summed by all-reduce, gloo's automatic choice, and,
in 32-true and 16-mixed, by reduce to the owner) and loom::Ddp. Step i trains on rows [8i, 8i + 8), each rank
its half. Cases: 32-true; 16-mixed with a GradScaler that overflows and grows (init scale
2^20, growth interval 3: scale and growth tracker compared too); bf16-mixed with 4
micro-batches (no_sync); 32-true with the gradient norm clipped to 0.5 (AdamW); 32-true with
fused SGD (lr 0.05, momentum 0.9, the same StepLR) clipped to 1.0. Stage 1 and stage 2 must
equal Python bit for bit (with 2 ranks the sum of two shares has one order), and so must Ddp.

Clipped runs: each side records the norm at every step (Python: clip_grad_norm_'s return; loom:
the GradNorm rt.clip_gradients returns) on every rank. Ddp and stage 1 clip the whole averaged
gradient as Python does: norms and parameters bit for bit. Stage 2's norm is each shard's f32
norm, squared in f64, all-reduced and square-rooted (Python: one f32 norm of the 6 per-tensor
norms), and its clip coefficient is computed in f64 (Python: f32): a different rounding, so
  - its norm must be within NORM_REL (1e-6, about 8 f32 ulps) of Python's at every step, and
    equal on both ranks;
  - clipping must be active (norm > max_norm) on at least one step, on the same steps on both
    sides;
  - its parameters must be within param_bound(): the first-order effect of clip coefficients
    that differ by NORM_REL plus 3 f32 roundings, and one f32 ulp of rounding per step.
SGD is linear in the gradient, so a norm off by a constant factor moves the parameters (AdamW
nearly cancels one); the norm comparison catches it under either optimizer.

Then checkpoints: stage 2 on 4 ranks saves after step 10 (rank 0 writes the optimizer state of
every shard in Python's layout). Stock torch.load opens it; Python's single-process
AdamW(fused=True).load_state_dict continues it 10 steps on the whole batches, and loom's
Zero on 1 process must match bit for bit; resumed on 2 ranks, Zero stage 1 and stage 2 must
equal Ddp resumed from the same file.

Then the same run saved with ZeroCheckpoint::Sharded (a main file with rank 0's states and an
index, one file per other rank): Python's consolidation (torch.load and dict.update) gives the
consolidated file bit for bit; resumed on 1 process, on 2 ranks (Ddp, stage 1, stage 2) and on
4 (stage 2: each rank reads only its own shard) it continues as the consolidated file does;
an older save's shard file is removed; a missing shard is an error on every rank.

Usage: python zero_parity.py --worker BIN --dir DIR     (the driver)
"""

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from launch import bitwise, load_flat, maxdiff, ranks, torchrun

STEPS, GLOBAL, WORLD = 20, 8, 2
SAMPLES = STEPS * GLOBAL
LR, WD = 1e-2, 0.01
SGD_LR, MOMENTUM = 0.05, 0.9  # the worker's optimizer=sgd
BETA1, BETA2 = 0.9, 0.999  # AdamW's defaults, both sides
INIT_SCALE, GROWTH_INTERVAL = 2.0 ** 20, 3
# (precision, micro-batches, clip, optimizer)
RUNS = [("32-true", 1, 0.0, "adamw"), ("16-mixed", 1, 0.0, "adamw"),
        ("bf16-mixed", 4, 0.0, "adamw"), ("32-true", 1, 0.5, "adamw"), ("32-true", 1, 1.0, "sgd")]
# Stage 2's norm against Python's: relative difference at most NORM_REL at every step. Both
# round a sum of f32 squares differently (see the top); observed about 1e-7.
NORM_REL = 1e-6
F32_HALF_ULP = 2.0 ** -24  # relative rounding of one f32 operation; one ulp of a value below 1


def lr_sum(lr):
    """The sum of the lrs of the 20 steps under StepLR(6, 0.5)."""
    return sum(lr * 0.5 ** (step // 6) for step in range(STEPS))


def param_bound(optimizer, clip):
    """How far stage 2's parameters may be from Python's after 20 clipped steps.

    Within a step both sides multiply the same gradients by one coefficient each,
    min(clip / (norm + 1e-6), 1); they differ by a relative delta <= NORM_REL (the norms) + 3
    f32 roundings (Python's add, reciprocal and product). To first order (the gradients'
    dependence on the parameters neglected):
      - SGD: the clipped gradient has 2-norm <= clip, so each element differs by <= delta *
        clip; the momentum buffer sums them with weights momentum^k, <= delta * clip /
        (1 - momentum); the parameters move by lr times that each step.
      - AdamW: m-hat and sqrt(v-hat) each change by at most a relative delta, the update
        m-hat / sqrt(v-hat) by <= 2 delta times its bound (1 - beta1) / sqrt(1 - beta2) (Kingma
        and Ba, section 2.1: about 3.16); the parameters move by lr times that each step.
    Plus the f32 rounding of each step's parameter update, one ulp (2^-24 for |p| < 1, which
    the caller checks) per step.
    """
    delta = NORM_REL + 3 * F32_HALF_ULP
    if optimizer == "sgd":
        drift = lr_sum(SGD_LR) * clip * delta / (1 - MOMENTUM)
    else:
        drift = lr_sum(LR) * 2 * delta * (1 - BETA1) / (1 - BETA2) ** 0.5
    return drift + STEPS * F32_HALF_ULP


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def write_inputs(d):
    torch.manual_seed(4321)
    model = mlp()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / "init.bin")
    torch.randn(SAMPLES, 8).mul(3).numpy().astype("<f4").tofile(d / "x.bin")
    torch.randint(0, 4, (SAMPLES,)).numpy().astype("<i8").tofile(d / "y.bin")


def load_model(d):
    model = load_flat(mlp(), d / "init.bin")
    x = torch.from_numpy(np.fromfile(d / "x.bin", dtype="<f4").reshape(SAMPLES, 8))
    y = torch.from_numpy(np.fromfile(d / "y.bin", dtype="<i8"))
    return model, x, y


def forward_loss(model, x, y, low):
    if low is not None:  # as loom and Fabric do: low-precision inputs, fp32 output
        with torch.autocast("cpu", dtype=low):
            out = model(x.to(low))
        out = out.float()
    else:
        out = model(x)
    return torch.nn.functional.cross_entropy(out, y)


def python_side(d, precision, accumulate, clip, optimizer):
    import contextlib

    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, y = load_model(d)
    ddp = DDP(model)
    if optimizer == "sgd":
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD,
                                      lr=SGD_LR, momentum=MOMENTUM, fused=True)
    else:
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=LR,
                                      weight_decay=WD, fused=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, 6, 0.5)
    scaler = (torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
              if precision == "16-mixed" else None)
    low = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    per = GLOBAL // world
    skipped = 0
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        rows = slice(step * GLOBAL + rank * per, step * GLOBAL + (rank + 1) * per)
        xs, ys = x[rows].tensor_split(accumulate), y[rows].tensor_split(accumulate)
        for j in range(accumulate):
            last = j == accumulate - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                loss = forward_loss(ddp, xs[j], ys[j], low)
                if accumulate > 1:
                    loss = loss / accumulate
                (scaler.scale(loss) if scaler else loss).backward()
        if clip > 0:
            if scaler:
                scaler.unscale_(opt)
            norms.append(float(torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip)))
        if scaler:
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped += scaler.get_scale() < before
        else:
            opt.step()
        sched.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / f"python_rank{rank}.bin")
    if scaler:
        (d / f"python_rank{rank}.scaler").write_text(
            f"{scaler.get_scale()} {scaler._get_growth_tracker()} {skipped}")
    if clip > 0:
        (d / f"python_rank{rank}.norms").write_text("".join(f"{n!r}\n" for n in norms))
    dist.barrier()
    dist.destroy_process_group()


def python_resume(d, ckpt, start):
    """Stock torch: the checkpoint loom's 4 ranks wrote, continued on one process."""
    torch.set_num_threads(1)
    model, x, y = load_model(d)
    saved = torch.load(ckpt, weights_only=True)
    model.load_state_dict(saved["model"])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, fused=True)
    opt.load_state_dict(saved["optimizer"])
    states = len(saved["optimizer"]["state"])
    for step in range(start, STEPS):
        opt.zero_grad()
        rows = slice(step * GLOBAL, (step + 1) * GLOBAL)
        forward_loss(model, x[rows], y[rows], None).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / "python_resume_rank0.bin")
    return states


def run(cmd, nproc, what, attempts=1):
    return torchrun(cmd, nproc, what, attempts, test="zero_parity")


def norms_of(d, tag):
    """Each rank's gradient norms, step by step (the .norms files)."""
    out = [[float(x) for x in (d / f"{tag}_rank{r}.norms").read_text().split()]
           for r in range(WORLD)]
    for r, norms in enumerate(out):
        if len(norms) != STEPS:
            raise SystemExit(f"zero_parity: {tag} rank {r} recorded {len(norms)} norms, "
                             f"not {STEPS}")
        if norms != out[0]:
            raise SystemExit(f"zero_parity: {tag}: rank {r}'s norms differ from rank 0's: "
                             f"{norms} against {out[0]}")
    return out[0]


def check_norms(what, tag, stage, optimizer, clip, py_norms, lm_norms, py, lm):
    """The clipped runs: the norms step by step, clipping active, and stage 2's parameters
    within param_bound() (stage 0 and 1's parameters are compared bit for bit by the caller).
    Returns the line to print."""
    rel = max(abs(a - b) / a for a, b in zip(py_norms, lm_norms))
    py_active = [i for i, n in enumerate(py_norms) if n > clip]
    lm_active = [i for i, n in enumerate(lm_norms) if n > clip]
    line = (f"zero parity {what}: loom {tag} gradient norm vs Python's clip_grad_norm_ at each "
            f"of {STEPS} steps: max relative difference {rel:.3g} "
            f"({'bitwise equal' if py_norms == lm_norms else 'NOT bitwise'}); "
            f"norms {min(py_norms):.3g} to {max(py_norms):.3g}, clipping active (norm > {clip}) "
            f"on {len(py_active)} of {STEPS} steps {py_active} (loom: {len(lm_active)})")
    if not py_active or not lm_active:
        raise SystemExit(f"zero_parity: clipping was never active: {line}")
    if stage < 2 and py_norms != lm_norms:
        raise SystemExit(f"zero_parity: loom {tag} ({what}): the norms are not Python's bits: "
                         f"{line}")
    if rel > NORM_REL:
        raise SystemExit(f"zero_parity: loom {tag} ({what}): the sharded norm is more than "
                         f"{NORM_REL:g} (relative) from Python's: {line}")
    if py_active != lm_active:
        raise SystemExit(f"zero_parity: loom {tag} clipped other steps than Python: {line}")
    if stage < 2:
        return line
    largest = max(float(np.abs(x).max()) for x in py)
    if largest >= 1:
        raise SystemExit(f"zero_parity: a parameter reached {largest}: param_bound() assumes "
                         f"|p| < 1")
    bound = param_bound(optimizer, clip)
    diff = maxdiff(py, lm)
    line += f"; parameters max|diff| {diff:g} (bound {bound:.3g})"
    if diff > bound:
        raise SystemExit(f"zero_parity: loom {tag} ({what}): parameters beyond the bound: {line}")
    return line


def driver(worker, d):
    d.mkdir(parents=True, exist_ok=True)
    write_inputs(d)
    common = [f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}", f"init_scale={INIT_SCALE}",
              f"growth_interval={GROWTH_INTERVAL}"]
    init = np.fromfile(d / "init.bin", dtype="<f4")
    for precision, k, clip, optimizer in RUNS:
        for f in [f for ext in ("bin", "scaler", "norms") for f in d.glob(f"*_rank*.{ext}")]:
            f.unlink()
        what = precision + (f", {k} micro-batches" if k > 1 else "") + \
            (", SGD" if optimizer == "sgd" else "") + (f", clip {clip}" if clip else "")
        run([__file__, "--role", "python", "--dir", str(d), "--precision", precision,
             "--accumulate", str(k), "--clip", str(clip), "--optimizer", optimizer], WORLD,
            f"Python ({what})", attempts=2)
        py = ranks(d, "python", WORLD)
        py_norms = norms_of(d, "python") if clip else None
        # Stage 2 sums its buckets by all-reduce on gloo (automatic); "zero2r" forces the
        # reduce to the owner (NCCL's choice) so that both collectives are proven.
        stages = (0, 1, 2, 3) if precision in ("32-true", "16-mixed") and not clip else (0, 1, 2)
        for stage in stages:
            tag = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero2r"}[stage]
            out = run(["--no-python", worker, "zero", *common, f"precision={precision}",
                       f"accumulate={k}", f"clip={clip}", f"optimizer={optimizer}",
                       f"stage={min(stage, 2)}", f"tag={tag}",
                       "bucket_bytes=2048", f"collective={'reduce' if stage == 3 else 'automatic'}"],
                      WORLD, f"loom {tag} ({what})")
            if "DIFFER" in out:
                raise SystemExit(f"zero_parity: loom {tag} ({what}): ranks differ\n{out}")
            lm = ranks(d, tag, WORLD)
            same = bitwise(py, lm)
            line = (f"zero parity {what}: loom {tag} vs Python ZeRO max|diff| {maxdiff(py, lm):g} "
                    f"({'bitwise equal' if same else 'NOT bitwise'}), moved from init by "
                    f"{float(np.abs(lm[0] - init).max()):.3g}")
            if precision == "16-mixed":
                ps = [(d / f"python_rank{r}.scaler").read_text().split() for r in range(WORLD)]
                ls = [(d / f"{tag}_rank{r}.scaler").read_text().split() for r in range(WORLD)]
                ok = all(float(p[0]) == float(q[0]) and int(p[1]) == int(q[1])
                         for p, q in zip(ps, ls))
                line += (f", scaler (scale, growth tracker) loom {ls[0][:2]} Python {ps[0][:2]} "
                         f"({ps[0][2]} backoffs): {'equal' if ok else 'NOT equal'}")
                same = same and ok and int(ps[0][2]) > 0
            print(line)
            if clip:
                print(check_norms(what, tag, stage, optimizer, clip, py_norms,
                                  norms_of(d, tag), py, lm))
            if not same and not (stage >= 2 and clip):
                raise SystemExit(f"zero_parity: loom {tag} ({what}) differs from Python's ZeRO")
            for line_ in sorted(x for x in out.splitlines() if "zero memory" in x):
                print("  " + line_.strip())

    # Checkpoints: saved by 4 ranks at stage 2, resumed by 1 (against stock torch) and 2.
    ckpt = d / "zero4.pt"
    run(["--no-python", worker, "zero", *common, "stage=2", "tag=four", "save_at=10",
         f"save={ckpt}"], 4, "loom zero2 on 4 ranks, saving")
    states = python_resume(d, ckpt, 10)
    run([worker, "zero", *common, "stage=1", "tag=resume1", f"load={ckpt}", "start=10"], 0,
        "loom zero1 on 1 process, resuming")
    py, lm = ranks(d, "python_resume", 1), ranks(d, "resume1", 1)
    print(f"zero checkpoint: saved by 4 ranks at stage 2, {states} parameter states in the "
          f"optimizer entry (of 6); resumed by Python's AdamW(fused=True) and by loom::Zero on "
          f"1 process: max|diff| {maxdiff(py, lm):g} "
          f"({'bitwise equal' if bitwise(py, lm) else 'NOT bitwise'})")
    if states != 6 or not bitwise(py, lm):
        raise SystemExit("zero_parity: the 4-rank checkpoint does not continue as Python's")
    finals = {}
    for stage in (0, 1, 2):
        tag = f"resume2_{stage}"
        run(["--no-python", worker, "zero", *common, f"stage={stage}", f"tag={tag}",
             f"load={ckpt}", "start=10"], WORLD, f"loom stage {stage} on 2 ranks, resuming")
        finals[stage] = ranks(d, tag, WORLD)
    ok = bitwise(finals[0], finals[1]) and bitwise(finals[0], finals[2])
    print(f"zero checkpoint: resumed on 2 ranks, stage 1 and stage 2 vs Ddp: "
          f"{'bitwise equal' if ok else 'NOT bitwise'} (max|diff| "
          f"{max(maxdiff(finals[0], finals[1]), maxdiff(finals[0], finals[2])):g})")
    if not ok:
        raise SystemExit("zero_parity: the resumed shards differ from Ddp")
    sharded_checkpoints(worker, d, common, ckpt, finals[0])
    print("dist zero: ok")


def consolidate(path):
    """What docs/memory.md tells a Python user to do with a sharded checkpoint."""
    saved = torch.load(path, weights_only=True)
    index = saved.pop("loom_shards")
    for name in index["files"]:
        for entry, states in torch.load(path.parent / name, weights_only=True).items():
            saved[entry]["state"].update(states)
    return saved, index


def same_values(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and \
            all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    return a == b


def sharded_checkpoints(worker, d, common, consolidated, ddp_final):
    """ZeroCheckpoint::Sharded: the 4-rank stage-2 run at step 10, one file per rank."""
    ckpt = d / "zero4s.pt"
    stale = d / "zero4s.00000000deadbeef.shard-1-of-4.pt"  # a save that did not finish
    stale.write_bytes(b"an older save's shard")
    run(["--no-python", worker, "zero", *common, "stage=2", "tag=four_s", "save_at=10",
         f"save={ckpt}", "sharded=1"], 4, "loom zero2 on 4 ranks, saving sharded")
    if stale.exists():
        raise SystemExit("zero_parity: the sharded save left an older save's shard file")
    rank0 = len(torch.load(ckpt, weights_only=True)["optimizer"]["state"])
    merged, index = consolidate(ckpt)
    whole = torch.load(consolidated, weights_only=True)
    # Each process's generators start from a seed of its own (torch seeds them at random), so
    # the runtime entries' generator states differ between the two runs; all else must not.
    for saved in (merged, whole):
        saved["runtime"].pop("device")
    files = [f for f in index["files"] if (d / f).is_file()]
    ok = index["world_size"] == 4 and len(files) == 3 and same_values(merged, whole)
    print(f"zero sharded checkpoint: main file with {rank0} of 6 parameter states (rank 0's) and "
          f"an index naming {len(files)} shard files; consolidated by Python "
          f"(torch.load + dict.update): {'bitwise equal' if ok else 'NOT equal'} to the "
          f"consolidated checkpoint of the same run")
    if not ok or not 0 < rank0 < 6:
        raise SystemExit("zero_parity: the sharded checkpoint is not the consolidated one")

    # Resumed at 1 process, at 2 ranks (Ddp, stage 1, stage 2: every shard read), and at 4
    # (stage 2, the saving partition: each rank reads its own shard only).
    run([worker, "zero", *common, "stage=1", "tag=resume1s", f"load={ckpt}", "start=10"], 0,
        "loom zero1 on 1 process, resuming sharded")
    results = [("1 process", ranks(d, "resume1", 1), ranks(d, "resume1s", 1))]
    for stage in (0, 1, 2):
        tag = f"resume2s_{stage}"
        run(["--no-python", worker, "zero", *common, f"stage={stage}", f"tag={tag}",
             f"load={ckpt}", "start=10"], WORLD, f"loom stage {stage} on 2 ranks, resuming sharded")
        results.append((f"2 ranks stage {stage}", ddp_final, ranks(d, tag, WORLD)))
    for source, tag in ((consolidated, "resume4c"), (ckpt, "resume4s")):
        run(["--no-python", worker, "zero", *common, "stage=2", f"tag={tag}", f"load={source}",
             "start=10"], 4, f"loom zero2 on 4 ranks, resuming from {source.name}")
    results.append(("4 ranks stage 2", ranks(d, "resume4c", 4), ranks(d, "resume4s", 4)))
    for what, want, got in results:
        same = bitwise(want, got)
        print(f"zero sharded checkpoint: resumed on {what}: "
              f"{'bitwise equal' if same else 'NOT bitwise'} to the resume from the consolidated "
              f"file (max|diff| {maxdiff(want, got):g})")
        if not same:
            raise SystemExit(f"zero_parity: the sharded resume on {what} differs")

    # A shard missing (its rank's save never finished): every rank stops with the reason.
    missing = d / index["files"][0]
    missing.rename(d / "moved.pt")
    try:
        # Started by hand (not torchrun, which stops the others once one rank exits), so that
        # each rank's own exit and message are seen.
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        procs = []
        for rank in range(4):
            env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE="4", LOCAL_WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [worker, "zero", *common, "stage=2", "tag=broken", f"load={ckpt}", "start=10"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = []
        for proc in procs:
            try:
                outs.append((proc.communicate(timeout=120)[0], proc.returncode))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise SystemExit("zero_parity: a rank hung on a missing shard")
    finally:
        (d / "moved.pt").rename(missing)
    told = sum(1 for out, code in outs if code != 0 and "which is missing" in out and
               "failed on rank 1" in out and missing.name in out)
    print(f"zero sharded checkpoint: with rank 1's shard missing, {told} of 4 ranks exit "
          f"non-zero naming the missing file and rank 1")
    if told != 4:
        sys.stderr.write("\n".join(out[-1500:] for out, _ in outs))
        raise SystemExit("zero_parity: a missing shard is not an error on every rank")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="driver")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--worker")
    ap.add_argument("--precision", default="32-true")
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    a = ap.parse_args()
    d = Path(a.dir).resolve()
    if a.role == "python":
        python_side(d, a.precision, a.accumulate, a.clip, a.optimizer)
    else:
        driver(a.worker, d)


if __name__ == "__main__":
    main()
