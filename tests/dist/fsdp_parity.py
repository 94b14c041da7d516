"""Parity of loom::Fsdp with Python's FSDP2 (fully_shard) on 2 ranks (gloo, torchrun).

The same model (three blocks x + down(tanh(up(norm(x)))) with LayerNorm(15), Linear 15-32,
Linear 32-15, then LayerNorm(15) and Linear 15-5: row counts 15 and 5 leave the last rank's
pieces padded), initial weights and data, trained 20 steps with fused AdamW (lr 1e-2, weight
decay 0.01) by Python (fully_shard on each block, then on the model: four units) +
torch.optim.AdamW(fused=True), and by loom (tests/dist/fsdp_worker.cpp: each block a
loom::FsdpUnit, the model the root) under loom::Fsdp. Step i trains on rows [8i, 8i + 8),
each rank its half. Cases: 32-true (and loom with reshard_after_forward off, against the
same Python run); MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32); 4 micro-batches
(Python: set_requires_gradient_sync(False) on all but the last; loom: no_backward_sync);
each block's body under activation checkpointing (Python: torch.utils.checkpoint,
use_reentrant=False; loom: loom::activation_checkpoint); the gradient norm clipped to 0.5
(norms compared step by step). Each must equal Python bit for bit: the whole parameters after
the last step and, clipped, every step's norm.

loom::Ddp on the same run (the FsdpUnit blocks are plain blocks there) is reported beside it
in the cases of the parameters' own dtype, not required to be equal: its fused AdamW steps
the whole parameters, whose kernel splits the work by tensor size, so its roundings may differ
from those of the pieces (where they agree the line says so).

Usage: python fsdp_parity.py --worker BIN --dcp-tool BIN --dir DIR [--cuda]   (the driver; --cuda: the GPU
smoke run of cuda_smoke below)
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import launch
from launch import bitwise, load_flat, maxdiff, torchrun

STEPS, GLOBAL, WORLD = 20, 8, 2
WIDTH, HIDDEN, CLASSES = 15, 32, 5
SAMPLES = STEPS * GLOBAL
LR, WD = 1e-2, 0.01
# (name, micro-batches, clip, policy, checkpoint, loom's extra runs: (tag, worker args))
RUNS = [("32-true", 1, 0.0, "", 0, [("fsdp_keep", ["reshard=0"])]),
        ("bf16 param / f32 reduce", 1, 0.0, "bf16", 0, []),
        ("4 micro-batches", 4, 0.0, "", 0, []),
        ("activation checkpointing", 1, 0.0, "", 1, []),
        ("clip 0.5", 1, 0.5, "", 0, [])]


class Block(torch.nn.Module):
    def __init__(self, checkpoint):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, WIDTH)
        self.checkpoint = checkpoint

    def body(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))

    def forward(self, x):
        if self.checkpoint:
            from torch.utils.checkpoint import checkpoint
            return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


def model_(checkpoint=False):
    return torch.nn.Sequential(Block(checkpoint), Block(checkpoint), Block(checkpoint),
                               torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, CLASSES))


def write_inputs(d):
    torch.manual_seed(1234)
    model = model_()
    with torch.no_grad():  # LayerNorm's ones and zeros moved, so its pieces differ too
        for p in model.parameters():
            p.add_(torch.randn_like(p).mul(0.1))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / "init.bin")
    torch.randn(SAMPLES, WIDTH).mul(3).numpy().astype("<f4").tofile(d / "x.bin")
    torch.randint(0, CLASSES, (SAMPLES,)).numpy().astype("<i8").tofile(d / "y.bin")


def load(d, checkpoint=False):
    model = load_flat(model_(checkpoint), d / "init.bin")
    x = torch.from_numpy(np.fromfile(d / "x.bin", dtype="<f4").reshape(SAMPLES, WIDTH))
    y = torch.from_numpy(np.fromfile(d / "y.bin", dtype="<i8"))
    return model, x, y


def python_side(d, accumulate, clip, policy, checkpoint, dcp_at=0, load_from="", start=0,
                tag="python"):
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, y = load(d, checkpoint)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if policy == "bf16" else MixedPrecisionPolicy()
    for block in model[:3]:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, fused=True)
    if load_from and Path(load_from).is_dir():  # a DCP directory loom wrote: dcp.load
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optimizer": osd}
        dcp.load(sd, checkpoint_id=load_from)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
    elif load_from:  # a file loom wrote: its whole tensors, the optimizer keyed by ids
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        ckpt = torch.load(load_from, weights_only=True)
        names = [name for name, _ in model.named_parameters()]
        osd = ckpt["optimizer"]
        osd = {"state": {names[i]: v for i, v in osd["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                                for g in osd["param_groups"]]}
        set_state_dict(model, opt, model_state_dict=ckpt["model"], optim_state_dict=osd,
                       options=StateDictOptions(full_state_dict=True))
    per = GLOBAL // world
    norms = []
    for step in range(start, STEPS):
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
        if step + 1 == dcp_at:  # Python's sharded save: torch.distributed.checkpoint
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(d / "dcp_python"))
    flat = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    flat.numpy().astype("<f4").tofile(d / f"{tag}_rank{rank}.bin")
    if clip > 0:
        (d / f"python_rank{rank}.norms").write_text("".join(f"{n!r}\n" for n in norms))
    dist.barrier()
    dist.destroy_process_group()


def ranks(d, tag):
    return launch.ranks(d, tag, WORLD)


def norms(d, tag):
    return [[float(v) for v in (d / f"{tag}_rank{r}.norms").read_text().split()]
            for r in range(WORLD)]


def whole_bytes(shapes, itemsize):
    """The bytes of a unit's whole parameters as FSDP2 gathers them: torch.chunk's rows
    ceil(d0 / world) from every rank, padding included."""
    total = 0
    for shape in shapes:
        rows = -(-shape[0] // WORLD) * WORLD
        total += rows * int(np.prod(shape[1:], dtype=np.int64)) * itemsize
    return total


def expect_whole(out, tag, policy):
    """After the first forward only the root (and, with reshard_after_forward off, every
    block) holds whole parameters; after the backward none does."""
    item = 2 if policy == "bf16" else 4
    root = whole_bytes([(WIDTH,), (WIDTH,), (CLASSES, WIDTH), (CLASSES,)], item)
    block = whole_bytes([(WIDTH,), (WIDTH,), (HIDDEN, WIDTH), (HIDDEN,), (WIDTH, HIDDEN),
                         (WIDTH,)], item)
    kept = block if tag == "fsdp_keep" else 0
    want = [f"fsdp whole bytes after forward: ''={root} " +
            " ".join(f"'{i}'={kept}" for i in range(3)),
            "fsdp whole bytes after backward: ''=0 '0'=0 '1'=0 '2'=0"]
    for line in want:
        if line not in out:
            print(out)
            raise SystemExit(f"fsdp_parity: loom {tag}: expected the line {line!r}")


def flat_model(ckpt):
    return np.concatenate([t.reshape(-1).numpy() for t in ckpt["model"].values()])


def same_file(a, b):
    """Whether two checkpoints hold the same keys and bitwise the same tensors."""
    def walk(x, y, path):
        if isinstance(x, dict):
            if not isinstance(y, dict) or list(x) != list(y):
                return f"{path}: keys {list(x)[:4]}... against {list(y)[:4] if isinstance(y, dict) else y}"
            for k in x:
                why = walk(x[k], y[k], f"{path}.{k}")
                if why:
                    return why
            return ""
        if isinstance(x, (list, tuple)):
            if len(x) != len(y):
                return f"{path}: lengths differ"
            for i, (u, v) in enumerate(zip(x, y)):
                why = walk(u, v, f"{path}[{i}]")
                if why:
                    return why
            return ""
        if isinstance(x, torch.Tensor):
            if (not isinstance(y, torch.Tensor) or x.dtype != y.dtype or x.shape != y.shape
                    or not torch.equal(x.view(-1).view(torch.uint8) if x.numel() else x,
                                       y.view(-1).view(torch.uint8) if y.numel() else y)):
                return f"{path}: tensors differ"
            return ""
        return "" if x == y else f"{path}: {x!r} against {y!r}"
    return walk(a, b, "")


def checkpoints(worker, d, py):
    """rt.save under Fsdp writes one consolidated file (the whole tensors, Python's layout):
    resumed on 2 ranks it continues bitwise; Python's torch.load reads it, and Python's FSDP2
    resumes it (set_state_dict) bitwise equal to its own run; Fsdp on 1 and 4 ranks, Ddp and
    one process load it and save the same file again; Fsdp resumes from the file Ddp
    wrote."""
    common = [f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}"]
    half = STEPS // 2
    torchrun(["--no-python", worker, *common, f"save_at={half}", "tag=fsdp_a"], WORLD,
             "loom fsdp saving at step 10", test="fsdp_parity")
    ckpt = d / "ckpt_fsdp_a.pt"
    if not bitwise(py, ranks(d, "fsdp_a")):
        raise SystemExit("fsdp_parity: the run that saved differs from Python's")
    torchrun(["--no-python", worker, *common, f"load={ckpt}", f"start={half}", "tag=fsdp_b"],
             WORLD, "loom fsdp resuming at step 10", test="fsdp_parity")
    resumed = ranks(d, "fsdp_b")
    print(f"fsdp checkpoint: saved at step {half} on 2 ranks, resumed on 2: "
          f"{'bitwise equal' if bitwise(py, resumed) else 'NOT bitwise'} to Python's 20 steps")
    if not bitwise(py, resumed):
        raise SystemExit("fsdp_parity: the resumed run differs from the straight one")
    file = torch.load(ckpt, weights_only=True)
    saved = np.fromfile(d / "fsdp_a_saved_rank0.bin", dtype="<f4")
    shapes = {k: tuple(v.shape) for k, v in file["model"].items()}
    if shapes["0.up.weight"] != (HIDDEN, WIDTH) or shapes["4.weight"] != (CLASSES, WIDTH):
        raise SystemExit(f"fsdp_parity: the file's model is not whole: {shapes}")
    if not np.array_equal(flat_model(file).view("<u4"), saved.view("<u4")):
        raise SystemExit("fsdp_parity: the file's model is not the whole parameters at save")
    state = file["optimizer"]["state"]
    if len(state) != 22 or tuple(state[2]["exp_avg"].shape) != (HIDDEN, WIDTH) or \
            float(state[2]["step"]) != half:
        raise SystemExit("fsdp_parity: the file's optimizer state is not whole, or not at "
                         f"step {half}")
    print(f"fsdp checkpoint: torch.load reads {len(file['model'])} whole tensors and "
          f"{len(state)} optimizer states (step {half})")
    # The reverse: Python's FSDP2 takes loom's file (set_state_dict of the whole tensors, the
    # optimizer's ids named) and continues.
    torchrun([__file__, "--role", "python", "--dir", str(d), "--load-from", str(ckpt),
              "--from-step", str(half), "--tag", "python_from_loom"], WORLD,
             "Python FSDP2 resuming loom's file", attempts=3, test="fsdp_parity")
    if not bitwise(py, ranks(d, "python_from_loom")):
        raise SystemExit("fsdp_parity: Python's FSDP2 resumed loom's file and differs from its "
                         "own 20 steps")
    print(f"fsdp checkpoint: Python's FSDP2 resumed loom's file of step {half} "
          "(set_state_dict, full state dict): bitwise equal to its own 20 steps")
    for tag, nproc, strategy in (("fsdp1", 1, "fsdp"), ("fsdp4", 4, "fsdp"),
                                 ("ddp2", 2, "ddp"), ("single", 0, "single")):
        again = d / f"ckpt_{tag}.pt"
        launcher = ["--no-python"] if nproc else []  # nproc 0: the worker alone
        torchrun([*launcher, worker, *common, f"strategy={strategy}", f"load={ckpt}",
                  f"start={half}", f"resave={again}", f"tag={tag}"], nproc,
                 f"loom {strategy} on {max(nproc, 1)} loading and saving again",
                 test="fsdp_parity")
        why = same_file(file, torch.load(again, weights_only=True))
        print(f"fsdp checkpoint: loaded by {strategy} on {max(nproc, 1)} rank(s) and saved "
              f"again: {'the same file' if not why else 'DIFFERENT: ' + why}")
        if why:
            raise SystemExit(f"fsdp_parity: {strategy} on {max(nproc, 1)} changed the file: {why}")
    torchrun(["--no-python", worker, *common, f"load={d / 'ckpt_ddp2.pt'}", f"start={half}",
              "tag=fsdp_c"], WORLD, "loom fsdp resuming from Ddp's file", test="fsdp_parity")
    if not bitwise(py, ranks(d, "fsdp_c")):
        raise SystemExit("fsdp_parity: resumed from Ddp's file, Fsdp differs from Python's")
    print("fsdp checkpoint: Fsdp resumed from the file Ddp wrote: bitwise equal to Python's")


def dcp_rows(tool, d, dcp_dir):
    """What an Fsdp rank reads of Python's DCP save: loom_dcp_tool reads it whole, then as
    each of 2 ranks' rows (dcp::load with FSDP2's cut, what Fsdp's rt.load does): every tensor
    of one dimension or more comes back as exactly those rows of the whole, and the bytes read
    are those of the rank's chunks and the objects, not the whole directory."""
    import re
    import subprocess

    def tool_run(*args):
        r = subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SystemExit(f"fsdp_parity: loom_dcp_tool {args[0]} failed: {r.stdout}{r.stderr}")
        return r.stdout.strip()

    tool_run("to-torch", dcp_dir, d / "dcp_whole.pt")
    whole = torch.load(d / "dcp_whole.pt", weights_only=True)
    for rank in range(WORLD):
        out = tool_run("rows", dcp_dir, d / f"dcp_rows{rank}.pt", rank, WORLD)
        items, all_items, read, total = map(int, re.search(
            r"(\d+) of (\d+) items, (\d+) of (\d+) bytes", out).groups())
        rows = torch.load(d / f"dcp_rows{rank}.pt", weights_only=True)
        checked = 0

        def walk(w, r, path):
            nonlocal checked
            if isinstance(w, dict):
                for k in w:
                    walk(w[k], r[k], f"{path}.{k}")
            elif isinstance(w, (list, tuple)):
                for i, (a, b) in enumerate(zip(w, r)):
                    walk(a, b, f"{path}[{i}]")
            elif isinstance(w, torch.Tensor) and w.dim() > 0:
                chunk = -(-w.shape[0] // WORLD)
                first = min(rank * chunk, w.shape[0])
                if not torch.equal(w[first:first + chunk], r):
                    raise SystemExit(f"fsdp_parity: rank {rank}'s rows of {path} differ")
                checked += 1
        walk(whole, rows, "")
        print(f"fsdp dcp: rank {rank} of {WORLD} read {items} of {all_items} items, {read} of "
              f"{total} bytes, and got exactly its rows of {checked} tensors")
        if not read < total * 3 // 4:
            raise SystemExit(f"fsdp_parity: rank {rank} read {read} of {total} bytes")


def dcp_checkpoints(worker, d, py, dcp_tool):
    """Python's torch.distributed.checkpoint directory (dcp.save of get_state_dict(model, opt)
    after 10 steps of FSDP2 on 2 ranks: each rank's rows of every tensor, the optimizer state
    keyed by parameter names) read by rt.load: Fsdp on 2 ranks resumes it bitwise equal to
    Python's own 20 steps; Fsdp on 4 and 1 ranks, Ddp on 2 and one process resume it exactly
    as they resume loom's consolidated file of the same step (checkpoints() wrote it)."""
    common = [f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}"]
    half = STEPS // 2
    dcp_dir = d / "dcp_python"
    files = sorted(p.name for p in dcp_dir.iterdir())
    if files != [".metadata", "__0_0.distcp", "__1_0.distcp"]:
        raise SystemExit(f"fsdp_parity: Python's DCP directory holds {files}")
    torchrun(["--no-python", worker, *common, f"load={dcp_dir}", f"start={half}",
              "tag=dcp_fsdp2"], WORLD, "loom fsdp resuming Python's DCP save", test="fsdp_parity")
    if not bitwise(py, ranks(d, "dcp_fsdp2")):
        raise SystemExit("fsdp_parity: resumed from Python's DCP save, Fsdp differs from "
                         "Python's own 20 steps")
    print(f"fsdp dcp: Python's dcp.save at step {half} ({', '.join(files)}) resumed by loom "
          "Fsdp on 2 ranks: bitwise equal to Python's 20 steps")
    dcp_rows(dcp_tool, d, dcp_dir)
    ckpt = d / "ckpt_fsdp_a.pt"  # loom's consolidated file of the same step
    for tag, nproc, strategy in (("fsdp4", 4, "fsdp"), ("fsdp1", 1, "fsdp"),
                                 ("ddp2", 2, "ddp"), ("zero2", 2, "zero"),
                                 ("single", 0, "single")):
        launcher = ["--no-python"] if nproc else []
        runs = []
        for source, path in (("dcp", dcp_dir), ("file", ckpt)):
            out = torchrun([*launcher, worker, *common, f"strategy={strategy}", f"load={path}",
                            f"start={half}", f"tag=dcp_{tag}_{source}"], nproc,
                           f"loom {strategy} on {max(nproc, 1)} resuming the {source}",
                           test="fsdp_parity")
            runs.append(launch.ranks(d, f"dcp_{tag}_{source}", max(nproc, 1)))
            if strategy == "zero" and source == "dcp":
                zero_reads_its_states(out, nproc)
        same = bitwise(runs[0], runs[1])
        print(f"fsdp dcp: resumed by loom {strategy} on {max(nproc, 1)} rank(s): "
              f"{'bitwise equal' if same else 'NOT bitwise equal'} to resuming loom's "
              "consolidated file of the same step")
        if not same:
            raise SystemExit(f"fsdp_parity: {strategy} on {max(nproc, 1)} resumed Python's "
                             "DCP save differently from loom's file")


def zero_reads_its_states(out, nproc):
    """A loom::Zero rank reads of a DCP directory only the optimizer states of the parameters it
    owns: after rt.load each rank holds fewer than all, and together every one, once."""
    import re
    counts = [tuple(map(int, m)) for m in re.findall(
        r"optimizer states after load: (\d+) of (\d+)", out)]
    if len(counts) != nproc:
        raise SystemExit(f"fsdp_parity: {len(counts)} Zero ranks said what they loaded: {out}")
    total = counts[0][1]
    held = [c for c, _ in counts]
    if sum(held) != total or max(held) >= total:
        raise SystemExit(f"fsdp_parity: Zero's ranks loaded {held} optimizer states of {total} "
                         "from the DCP directory; each should read only those it owns")
    print(f"fsdp dcp: Zero's {nproc} ranks read {' + '.join(map(str, held))} of the {total} "
          "parameters' optimizer states from Python's DCP directory (each its own)")


def dcp_writes(worker, d, py):
    """FsdpCheckpoint::Dcp: loom's Fsdp on 2 ranks writes a DCP directory at step 10 (each
    rank its chunks, rank 0 the .metadata). Python's FSDP2 on 2 ranks loads it (dcp.load into
    get_state_dict's templates, set_state_dict) and continues bitwise equal to its own 20
    steps; dcp_to_torch_save makes one file of it holding loom's consolidated save of the same
    step (the optimizer keyed by names); loom's Fsdp resumes it on 2 ranks bitwise, on 4 and 1
    ranks as it resumes the consolidated file (dcp_checkpoints ran those)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    common = [f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}"]
    half = STEPS // 2
    torchrun(["--no-python", worker, *common, f"save_at={half}", "tag=fsdp_d", "dcp=1"],
             WORLD, "loom fsdp saving a DCP directory at step 10", test="fsdp_parity")
    out = d / "ckpt_fsdp_d.dcp"
    files = sorted(p.name for p in out.iterdir())
    if files != [".metadata", "__0_0.distcp", "__1_0.distcp"]:
        raise SystemExit(f"fsdp_parity: loom's DCP directory holds {files}")
    if not bitwise(py, ranks(d, "fsdp_d")):
        raise SystemExit("fsdp_parity: the run that saved a DCP directory differs from Python's")
    torchrun([__file__, "--role", "python", "--dir", str(d), "--load-from", str(out),
              "--from-step", str(half), "--tag", "python_from_loom_dcp"], WORLD,
             "Python FSDP2 resuming loom's DCP directory", attempts=3, test="fsdp_parity")
    if not bitwise(py, ranks(d, "python_from_loom_dcp")):
        raise SystemExit("fsdp_parity: Python's FSDP2 resumed loom's DCP directory and differs "
                         "from its own 20 steps")
    print(f"fsdp dcp write: loom Fsdp on 2 ranks wrote {out.name} ({', '.join(files)}) at step "
          f"{half}; Python's FSDP2 on 2 ranks dcp.load + set_state_dict: bitwise equal to its "
          f"own {STEPS} steps")
    dcp_to_torch_save(str(out), str(d / "ckpt_fsdp_d.pt"))
    got = torch.load(d / "ckpt_fsdp_d.pt", weights_only=False)
    whole = torch.load(d / "ckpt_fsdp_a.pt", weights_only=True)  # consolidated, same step
    names = [n for n in got["optimizer"]["param_groups"][0]["params"]]
    osd = whole["optimizer"]
    whole["optimizer"] = {
        "state": {names[i]: v for i, v in osd["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                         for g in osd["param_groups"]]}
    def by_key(x):  # DCP's files keep no dict order
        if isinstance(x, dict):
            return {k: by_key(x[k]) for k in sorted(x, key=str)}
        return [by_key(v) for v in x] if isinstance(x, list) else x
    why = same_file(by_key(whole), by_key(got))
    print("fsdp dcp write: dcp_to_torch_save of it: "
          f"{'loom consolidated file of the same step, names for ids' if not why else 'DIFFERENT: ' + why}")
    if why:
        raise SystemExit(f"fsdp_parity: loom's DCP directory is not its consolidated save: {why}")
    torchrun(["--no-python", worker, *common, f"load={out}", f"start={half}", "tag=dcp_loom2"],
             WORLD, "loom fsdp resuming its DCP directory", test="fsdp_parity")
    if not bitwise(py, ranks(d, "dcp_loom2")):
        raise SystemExit("fsdp_parity: Fsdp resumed its own DCP directory and differs")
    for tag, nproc in (("fsdp4", 4), ("fsdp1", 1)):
        torchrun(["--no-python", worker, *common, f"load={out}", f"start={half}",
                  f"tag=dcp_loom_{tag}"], nproc, f"loom fsdp on {nproc} resuming loom's DCP "
                 "directory", test="fsdp_parity")
        if not bitwise(launch.ranks(d, f"dcp_{tag}_file", nproc),
                       launch.ranks(d, f"dcp_loom_{tag}", nproc)):
            raise SystemExit(f"fsdp_parity: Fsdp on {nproc} resumed loom's DCP directory "
                             "differently from the consolidated file")
    print("fsdp dcp write: resumed by loom Fsdp on 2 ranks bitwise equal to Python's; on 4 and "
          "1 as from the consolidated file (saved at 2, loaded at 1 and 4)")
    # Asynchronous: loom::Checkpoints with {.async = true} under FsdpCheckpoint::Dcp, the
    # directory written in a thread (its collectives on a gloo group of their own) while steps
    # 10-19 run; the same checkpoint as the synchronous save's.
    torchrun(["--no-python", worker, *common, f"save_at={half}", "tag=fsdp_da", "dcp=1",
              "async=1"], WORLD, "loom fsdp saving a DCP directory asynchronously at step 10",
             test="fsdp_parity")
    if not bitwise(py, ranks(d, "fsdp_da")):
        raise SystemExit("fsdp_parity: the run that saved a DCP directory asynchronously "
                         "differs from Python's")
    ckpts = d / "ckpts_fsdp_da"
    listed = sorted(p.name for p in ckpts.iterdir())
    latest = (ckpts / "latest").read_text().strip()
    if listed != ["latest", f"step-{half}.pt"] or latest != f"step-{half}.pt":
        raise SystemExit(f"fsdp_parity: the asynchronous save left {listed}, latest {latest!r}")
    files = sorted(p.name for p in (ckpts / f"step-{half}.pt").iterdir())
    dcp_to_torch_save(str(ckpts / f"step-{half}.pt"), str(d / "ckpt_fsdp_da.pt"))
    why = same_file(by_key(torch.load(d / "ckpt_fsdp_d.pt", weights_only=False)),
                    by_key(torch.load(d / "ckpt_fsdp_da.pt", weights_only=False)))
    print(f"fsdp dcp write: asynchronous (Checkpoints' async, training on while it wrote): "
          f"step-{half}.pt ({', '.join(files)}), latest -> {latest}: "
          f"{'the synchronous save of the same step' if not why else 'DIFFERENT: ' + why}")
    if why:
        raise SystemExit(f"fsdp_parity: the asynchronous DCP save differs from the synchronous "
                         f"one: {why}")


def sharded_checkpoints(worker, d, py):
    """FsdpCheckpoint::Sharded: each rank writes its pieces (rank 0 the main file with an
    index, rank 1 one file beside it). Resumed on 2 ranks it continues bitwise; Fsdp on 1,
    Ddp on 2 and one process load it and save the consolidated file the consolidated save
    wrote at the same step; Fsdp on 4 loads it and saves its own 4 pieces, from which Fsdp on 2
    resumes bitwise (2 -> 4 -> 2 ranks); a missing shard file is an error that names it."""
    import glob
    import subprocess
    common = [f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}"]
    half = STEPS // 2
    torchrun(["--no-python", worker, *common, f"save_at={half}", "tag=fsdp_s", "sharded=1"],
             WORLD, "loom fsdp saving sharded at step 10", test="fsdp_parity")
    main = d / "ckpt_fsdp_s.pt"
    shards = sorted(glob.glob(str(d / "ckpt_fsdp_s.*.shard-*-of-2.pt")))
    if len(shards) != 1 or not shards[0].endswith(".shard-1-of-2.pt"):
        raise SystemExit(f"fsdp_parity: the sharded save wrote {shards} beside its main file")
    head = torch.load(main, weights_only=True)
    shapes = {k: tuple(v.shape) for k, v in head["model"].items()}
    if shapes["0.up.weight"] != (HIDDEN // 2, WIDTH) or shapes["4.weight"] != (3, WIDTH):
        raise SystemExit(f"fsdp_parity: the main file does not hold rank 0's pieces: {shapes}")
    index = head["loom_shards"]
    print(f"fsdp sharded checkpoint: main file with rank 0's pieces ({len(index['slots'])} "
          f"slots indexed) and {Path(shards[0]).name}")
    torchrun(["--no-python", worker, *common, f"load={main}", f"start={half}", "tag=fsdp_sb"],
             WORLD, "loom fsdp resuming from the sharded save", test="fsdp_parity")
    if not bitwise(py, ranks(d, "fsdp_sb")):
        raise SystemExit("fsdp_parity: resumed from the sharded save, Fsdp differs from Python's")
    print(f"fsdp sharded checkpoint: resumed on 2 ranks: bitwise equal to Python's {STEPS} steps")
    whole = torch.load(d / "ckpt_fsdp_a.pt", weights_only=True)  # consolidated, same step
    for tag, nproc, strategy in (("sfsdp1", 1, "fsdp"), ("sddp2", 2, "ddp"),
                                 ("ssingle", 0, "single")):
        again = d / f"ckpt_{tag}.pt"
        launcher = ["--no-python"] if nproc else []
        torchrun([*launcher, worker, *common, f"strategy={strategy}", f"load={main}",
                  f"start={half}", f"resave={again}", f"tag={tag}"], nproc,
                 f"loom {strategy} on {max(nproc, 1)} loading the sharded save",
                 test="fsdp_parity")
        why = same_file(whole, torch.load(again, weights_only=True))
        print(f"fsdp sharded checkpoint: loaded by {strategy} on {max(nproc, 1)} rank(s), saved "
              f"consolidated: {'the consolidated file' if not why else 'DIFFERENT: ' + why}")
        if why:
            raise SystemExit(f"fsdp_parity: {strategy} on {max(nproc, 1)} read the sharded save "
                             f"wrongly: {why}")
    four = d / "ckpt_sfsdp4.pt"
    torchrun(["--no-python", worker, *common, f"load={main}", f"start={half}",
              f"resave={four}", "sharded=1", "tag=sfsdp4"], 4,
             "loom fsdp on 4 loading the sharded save and saving its pieces", test="fsdp_parity")
    if len(glob.glob(str(d / "ckpt_sfsdp4.*.shard-*-of-4.pt"))) != 3:
        raise SystemExit("fsdp_parity: Fsdp on 4 ranks did not write 3 shard files")
    torchrun(["--no-python", worker, *common, f"load={four}", f"start={half}", "tag=fsdp_s4"],
             WORLD, "loom fsdp on 2 resuming from 4 ranks' pieces", test="fsdp_parity")
    if not bitwise(py, ranks(d, "fsdp_s4")):
        raise SystemExit("fsdp_parity: resumed from 4 ranks' pieces, Fsdp differs from Python's")
    print("fsdp sharded checkpoint: saved on 2, loaded and saved by 4, resumed on 2: bitwise "
          "equal to Python's")
    lone = d / "lone"
    lone.mkdir(exist_ok=True)
    (lone / "ckpt.pt").write_bytes(main.read_bytes())
    r = subprocess.run([worker, *common, "strategy=single", f"load={lone / 'ckpt.pt'}",
                        f"start={half}", "tag=lone"], capture_output=True, text=True,
                       timeout=120)
    if r.returncode == 0 or "which is missing" not in r.stderr:
        raise SystemExit(f"fsdp_parity: a missing shard file was not named: {r.stderr[-500:]}")
    print("fsdp sharded checkpoint: without its shard file: " +
          r.stderr.strip().splitlines()[-1][:150])


def empty_init(worker, d, py):
    """The model built under loom::EmptyInit (meta tensors, no values): Fsdp on 2 ranks
    resumes from the consolidated and from the sharded save (each rank allocating and reading
    only its pieces) bitwise; Ddp on 2 loads the consolidated file into it and saves the same
    file again; rt.reset_parameters gives Fsdp on 2 and 4 ranks, Ddp on 2 and one process the
    values one process's normal build gets with the same seed; without either, forward
    refuses to run and says why."""
    import subprocess
    common = [f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}"]
    half = STEPS // 2
    for tag, ckpt in (("empty_c", "ckpt_fsdp_a.pt"), ("empty_s", "ckpt_fsdp_s.pt")):
        torchrun(["--no-python", worker, *common, "empty=1", f"load={d / ckpt}",
                  f"start={half}", f"tag={tag}"], WORLD, f"loom fsdp, empty, resuming {ckpt}",
                 test="fsdp_parity")
        if not bitwise(py, ranks(d, tag)):
            raise SystemExit(f"fsdp_parity: built empty and resumed from {ckpt}, Fsdp differs "
                             "from Python's")
        print(f"fsdp empty init: built on the meta device, resumed from {ckpt} on 2 ranks: "
              "bitwise equal to Python's")
    again = d / "ckpt_empty_ddp.pt"
    torchrun(["--no-python", worker, *common, "strategy=ddp", "empty=1",
              f"load={d / 'ckpt_fsdp_a.pt'}", f"start={half}", f"resave={again}",
              "tag=empty_ddp"], WORLD, "loom ddp, empty, loading", test="fsdp_parity")
    why = same_file(torch.load(d / "ckpt_fsdp_a.pt", weights_only=True),
                    torch.load(again, weights_only=True))
    if why:
        raise SystemExit(f"fsdp_parity: Ddp built empty read the file wrongly: {why}")
    print("fsdp empty init: Ddp on 2 built empty, loaded and saved again: the same file")
    seed = ["steps=0", "seed=7"]
    torchrun([worker, *common, *seed, "strategy=single", "tag=seed_ref"], 0,
             "loom single, seeded", test="fsdp_parity")
    ref = launch.ranks(d, "seed_ref", 1)[0]
    for tag, nproc, strategy in (("reset_f2", 2, "fsdp"), ("reset_f4", 4, "fsdp"),
                                 ("reset_d2", 2, "ddp"), ("reset_s", 0, "single")):
        launcher = ["--no-python"] if nproc else []
        torchrun([*launcher, worker, *common, "steps=0", "empty=1", "reset=7",
                  f"strategy={strategy}", f"tag={tag}"], nproc,
                 f"loom {strategy}, empty, reset_parameters", test="fsdp_parity")
        got = launch.ranks(d, tag, max(nproc, 1))
        if not bitwise([ref] * len(got), got):
            raise SystemExit(f"fsdp_parity: reset_parameters under {strategy} on "
                             f"{max(nproc, 1)} differs from the seeded build "
                             f"(max |diff| {maxdiff([ref] * len(got), got):.3g})")
        print(f"fsdp empty init: reset_parameters under {strategy} on {max(nproc, 1)} rank(s): "
              "bitwise the values of the seeded build")
    r = subprocess.run([worker, *common, "strategy=single", "empty=1", "tag=novalues"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 0 or "holds no values yet" not in r.stderr:
        raise SystemExit(f"fsdp_parity: forward ran without values: {r.stderr[-500:]}")
    print("fsdp empty init: without values: " + r.stderr.strip().splitlines()[-1][:160])


def cuda_smoke(worker, d):
    """On a GPU (ctest dist.cuda_fsdp, label gpu): loom::Fsdp on one rank over NCCL against
    one process, 20 steps each on CUDA: with one rank the gather and the reduce-scatter move
    nothing, so the two must be bitwise equal; bf16 param / f32 reduce runs beside; the peak
    of allocated bytes of each run is reported. Then the model built under loom::EmptyInit:
    its pieces allocated on the GPU, rt.reset_parameters under Fsdp on one rank must give the
    values one process's seeded build gets (moved to the GPU). Last, a DCP directory written
    from the GPU (FsdpCheckpoint::Dcp at step 10) and resumed on it: bitwise the straight
    run."""
    import re
    d.mkdir(parents=True, exist_ok=True)
    write_inputs(d)
    common = [f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}", "device=cuda"]
    runs = {}
    for tag, nproc, args in (("single", 0, ["strategy=single"]),
                             ("fsdp", 1, ["strategy=fsdp"]),
                             ("fsdp_bf16", 1, ["strategy=fsdp", "policy=bf16"])):
        launcher = ["--no-python"] if nproc else []
        out = torchrun([*launcher, worker, *common, *args, f"tag={tag}"], nproc,
                       f"loom {tag} on CUDA", test="cuda_fsdp")
        peak = re.search(r"peak allocated bytes (\d+)", out)
        runs[tag] = (np.fromfile(d / f"{tag}_rank0.bin", dtype="<f4"),
                     int(peak[1]) if peak else -1)
    same = np.array_equal(runs["single"][0].view("<u4"), runs["fsdp"][0].view("<u4"))
    line = (f"1 rank NCCL {'bitwise equal' if same else 'NOT bitwise equal'} to one process "
            f"after {STEPS} steps; peak allocated bytes: one process {runs['single'][1]}, "
            f"fsdp {runs['fsdp'][1]}, fsdp bf16/f32 {runs['fsdp_bf16'][1]}; bf16 policy "
            f"max|diff| {float(np.abs(runs['fsdp_bf16'][0] - runs['fsdp'][0]).max()):.3g}")
    if not same:
        raise SystemExit(f"dist cuda_fsdp: FAILED: {line}")
    seeded = []
    for tag, nproc, args in (("seeded", 0, ["strategy=single", "seed=7"]),
                             ("empty", 1, ["strategy=fsdp", "empty=1", "reset=7"])):
        launcher = ["--no-python"] if nproc else []
        torchrun([*launcher, worker, *common, "steps=0", *args, f"tag={tag}"], nproc,
                 f"loom {tag} on CUDA", test="cuda_fsdp")
        seeded.append(np.fromfile(d / f"{tag}_rank0.bin", dtype="<f4"))
    if not np.array_equal(seeded[0].view("<u4"), seeded[1].view("<u4")):
        raise SystemExit("dist cuda_fsdp: FAILED: an EmptyInit model reset under Fsdp on CUDA "
                         "differs from the seeded build")
    half = STEPS // 2
    torchrun(["--no-python", worker, *common, "strategy=fsdp", f"save_at={half}", "dcp=1",
              "tag=cuda_dcp"], 1, "loom fsdp on CUDA saving a DCP directory", test="cuda_fsdp")
    torchrun(["--no-python", worker, *common, "strategy=fsdp", f"load={d / 'ckpt_cuda_dcp.dcp'}",
              f"start={half}", "tag=cuda_dcp_resumed"], 1, "loom fsdp on CUDA resuming it",
             test="cuda_fsdp")
    resumed = np.fromfile(d / "cuda_dcp_resumed_rank0.bin", dtype="<f4")
    if not np.array_equal(resumed.view("<u4"), runs["fsdp"][0].view("<u4")):
        raise SystemExit("dist cuda_fsdp: FAILED: the DCP directory written from the GPU and "
                         "resumed differs from the straight run")
    print(f"dist cuda_fsdp: ok, {line}; EmptyInit + reset_parameters on CUDA: the seeded "
          "build's values; a DCP directory saved at step 10 from the GPU and resumed: bitwise "
          "the straight run")


def expect_prefetch(out, tag):
    """One micro-batch a step: the root gathers once a step; a block twice (forward and
    backward), once with reshard_after_forward off. In the forward of every step but the
    first, blocks 1 and 2 are gathered ahead by the block before them (forward prefetch); in
    the backward, blocks 0 and 1 by the block after them (backward prefetch)."""
    s = STEPS
    if tag == "fsdp":
        want = f"'0'={2 * s} ({s}) '1'={2 * s} ({2 * s - 1}) '2'={2 * s} ({s - 1})"
    else:
        want = f"'0'={s} (0) '1'={s} ({s - 1}) '2'={s} ({s - 1})"
    line = f"fsdp gathers (prefetched): ''={s} (0) {want}"
    if line not in out:
        print(out)
        raise SystemExit(f"fsdp_parity: loom {tag}: expected the line {line!r}")


def driver(worker, d, dcp_tool):
    d.mkdir(parents=True, exist_ok=True)
    write_inputs(d)
    init = np.fromfile(d / "init.bin", dtype="<f4")
    for what, k, clip, policy, ckpt, extra in RUNS:
        for f in [f for ext in ("bin", "norms") for f in d.glob(f"*_rank*.{ext}")]:
            f.unlink()
        dcp_at = ["--dcp-at", str(STEPS // 2)] if what == "32-true" else []
        torchrun([__file__, "--role", "python", "--dir", str(d), "--accumulate", str(k),
                  "--clip", str(clip), "--policy", policy, "--checkpoint", str(ckpt), *dcp_at],
                 WORLD,
                 f"Python FSDP2 ({what})", attempts=3, test="fsdp_parity")
        py = ranks(d, "python")
        if not bitwise(py[:1], py[1:]):
            raise SystemExit(f"fsdp_parity: Python's ranks differ ({what})")
        if what == "32-true":
            py_true = py
        common = [f"dir={d}", f"samples={SAMPLES}", f"steps={STEPS}", f"accumulate={k}",
                  f"clip={clip}", f"policy={policy}", f"checkpoint={ckpt}"]
        loom_runs = [("fsdp", ["strategy=fsdp"]), *extra]
        if not policy:
            loom_runs.append(("ddp", ["strategy=ddp"]))
        for tag, args in loom_runs:
            out = torchrun(["--no-python", worker, *common, *args, f"tag={tag}"], WORLD,
                           f"loom {tag} ({what})", test="fsdp_parity")
            required = tag != "ddp"
            if required and "fsdp units: ''=4 '0'=6 '1'=6 '2'=6" not in out:
                print(out)
                raise SystemExit("fsdp_parity: loom's units are not the root (4 parameters) "
                                 "and three blocks (6 each)")
            if required:
                expect_whole(out, tag, policy)
            if tag in ("fsdp", "fsdp_keep") and k == 1:
                expect_prefetch(out, tag)
            lm = ranks(d, tag)
            same = bitwise(py, lm)
            line = (f"fsdp parity {what}: loom {tag} vs Python fully_shard max|diff| "
                    f"{maxdiff(py, lm):g} ({'bitwise equal' if same else 'NOT bitwise'}), "
                    f"moved from init by {float(np.abs(lm[0] - init).max()):.3g}")
            if clip:
                pn, ln = norms(d, "python"), norms(d, tag)
                equal = pn == ln
                active = sum(n > clip for n in pn[0])
                line += (f"; norms {'bitwise equal' if equal else 'NOT equal'} at each of "
                         f"{STEPS} steps, clipping active on {active}")
                if required and (not equal or active == 0):
                    print(line)
                    raise SystemExit(f"fsdp_parity: loom {tag}'s norms ({what}) are not "
                                     f"Python's, or clipping never acted")
            print(line)
            if required and not same:
                raise SystemExit(f"fsdp_parity: loom {tag} ({what}) differs from Python's FSDP2")
            if not bitwise(lm[:1], lm[1:]):
                raise SystemExit(f"fsdp_parity: loom {tag}'s ranks differ ({what})")
    checkpoints(worker, d, py_true)
    dcp_checkpoints(worker, d, py_true, dcp_tool)
    dcp_writes(worker, d, py_true)
    sharded_checkpoints(worker, d, py_true)
    empty_init(worker, d, py_true)
    print("dist fsdp: ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="driver")
    ap.add_argument("--worker")
    ap.add_argument("--dcp-tool")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--policy", default="")
    ap.add_argument("--checkpoint", type=int, default=0)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--dcp-at", type=int, default=0)
    ap.add_argument("--load-from", default="")
    ap.add_argument("--from-step", type=int, default=0)
    ap.add_argument("--tag", default="python")
    a = ap.parse_args()
    d = Path(a.dir)
    if a.cuda:
        cuda_smoke(a.worker, d)
    elif a.role == "python":
        python_side(d, a.accumulate, a.clip, a.policy, a.checkpoint, a.dcp_at, a.load_from,
                    a.from_step, a.tag)
    else:
        driver(a.worker, d, a.dcp_tool)


if __name__ == "__main__":
    sys.exit(main())
