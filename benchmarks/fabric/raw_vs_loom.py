#!/usr/bin/env python3
"""loom against raw PyTorch, without Fabric: the MLPs, initial weights and batches of
fabric_vs_loom.py, trained by loom (loom_fabric_train --optimizer sgd|adam, loom::optim's fused
optimizer) and by plain PyTorch in this process in the fastest ways a Python user has:

  loom        loom_fabric_train --optimizer <opt>
  loom-graph  the same with --graph 1 (the whole step as one CUDA graph; CUDA only)
  eager       model, torch.optim.<Opt>(fused=True); per step: batch to the device, forward
              (under torch.autocast(device, bfloat16) for bf16-mixed, the logits cast back to
              float32 as Fabric and loom do), cross_entropy, backward, opt.step(), opt.zero_grad()
  compiled    the same, forward+loss+backward in one function compiled by torch.compile
              (default mode) and the optimizer step compiled by torch.compile(opt.step); if
              compiling the fused optimizer's step fails, the foreach optimizer is compiled
              instead (the row's "compiled_optimizer" says which)
  graph       the whole step captured as one CUDA graph, the "whole network capture" recipe
              of the PyTorch CUDA-graph docs: static input and target, 3 warm-up steps on a
              side stream, zero_grad(set_to_none=True), forward+loss+backward+opt.step()
              captured by torch.cuda.graph; each step copies the batch into the static
              tensors and replays (Adam with capturable=True; CUDA only)

  raw_vs_loom.py --loom-bin BIN --out JSON [--device cpu|cuda] [--threads 1]
                 [--sizes tiny,medium,large] [--precisions 32-true,bf16-mixed]
                 [--optimizers adam] [--sides loom,eager,compiled[,loom-graph,graph]]
                 [--reps 3] [--steps-scale 1.0]

Optimizers: adam = Adam(lr=1e-3), sgd = SGD(lr=0.01, momentum=0.9); loss cross_entropy; torch
threads = --threads on both sides; batch i % batches at step i. Every side of every rep trains
from the initial weights: warm-up steps (untimed), then the timed steps (on CUDA synchronized
before and after); steps/s. The step counts are those of fabric_vs_loom.py's SIZES times
--steps-scale (0.05 makes a smoke run); compiled warms up at least 3 steps, so that its
recompiles settle, and the wall time of its warm-up steps (which compile; each rep compiles
afresh after torch._dynamo.reset(), though Inductor's on-disk cache may serve the later reps)
is reported as its compile time, apart from its rate. The sides of a rep run one after the
other and the order rotates every rep; each side's best rep counts (large: --reps - 1 reps, at
least 1). Large bf16-mixed is left out on the CPU (minutes per run on a CPU without native
bf16).

Each row (size x precision x optimizer) holds every side's rates and best, compiled's compile
seconds, the ratios of the bests, each beside its target:
  loom/eager                 >= 2.3 on tiny
  loom/compiled              >= 1.0 on every size
  loom-graph/loom            >= 3 on tiny, >= 0.98 on large      (CUDA)
  loom-graph/graph           >= 0.95 on every size               (CUDA)
and the largest absolute difference of the final parameters of loom (and loom-graph) and eager
(0 or tiny for 32-true; informational). The JSON is written after every row, and a line per row
goes to stderr.
"""
import argparse
import contextlib
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

OPTIMIZERS = {"sgd": "SGD(lr=0.01, momentum=0.9)", "adam": "Adam(lr=1e-3)"}

# ratio name: (numerator side, denominator side, {size: target} or {None: target for all sizes})
RATIOS = {
    "loom_vs_eager": ("loom", "eager", {"tiny": 2.3}),
    "loom_vs_compiled": ("loom", "compiled", {None: 1.0}),
    "loom_graph_vs_loom": ("loom-graph", "loom", {"tiny": 3.0, "large": 0.98}),
    "loom_graph_vs_graph": ("loom-graph", "graph", {None: 0.95}),
}

# The optimizer implementation torch.compile(opt.step) ended up compiling, per optimizer name:
# "fused", or "foreach" once compiling the fused one failed.
COMPILED_IMPL = {}


def make_optimizer(name, params, impl, capturable=False):
    kw = {"fused": True} if impl == "fused" else {"foreach": True}
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, **kw)
    if capturable:
        kw["capturable"] = True
    return torch.optim.Adam(params, lr=1e-3, **kw)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def autocast(device, precision, cache_enabled=True):
    if precision == "bf16-mixed":
        return torch.autocast(device, dtype=torch.bfloat16, cache_enabled=cache_enabled)
    return contextlib.nullcontext()


def host_batches(x, y, batches):
    return [x[i].clone() for i in range(batches)], [y[i].clone() for i in range(batches)]


def final_params(model):
    return [p.detach().float().cpu() for p in model.parameters()]


def timed(step, device, first, steps):
    """Runs steps first .. first+steps-1; returns steps/s."""
    sync(device)
    t0 = time.perf_counter()
    for i in range(first, first + steps):
        step(i)
    sync(device)
    return steps / (time.perf_counter() - t0)


def eager_train(d, cfg, a, precision, optimizer, x, y):
    sizes, batches, steps, warmup = cfg["sizes"], cfg["batches"], cfg["steps"], cfg["warmup"]
    dev = a.device
    xs, ys = host_batches(x, y, batches)
    model = load_model(d, sizes).to(dev)
    opt = make_optimizer(optimizer, model.parameters(), "fused")

    def step(i):
        xb, yb = xs[i % batches].to(dev), ys[i % batches].to(dev)
        with autocast(dev, precision):
            out = model(xb)
        loss = F.cross_entropy(out.float(), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()

    for i in range(warmup):
        step(i)
    rate = timed(step, dev, warmup, steps)
    return {"rate": rate, "final": final_params(model)}


def compiled_train_once(d, cfg, a, precision, optimizer, x, y, impl):
    sizes, batches, steps = cfg["sizes"], cfg["batches"], cfg["steps"]
    warmup = max(3, cfg["warmup"])
    dev = a.device
    xs, ys = host_batches(x, y, batches)
    torch._dynamo.reset()
    model = load_model(d, sizes).to(dev)
    opt = make_optimizer(optimizer, model.parameters(), impl)

    def fwd_bwd(xb, yb):
        with autocast(dev, precision):
            out = model(xb)
        loss = F.cross_entropy(out.float(), yb)
        loss.backward()

    fwd_bwd_c = torch.compile(fwd_bwd)
    opt_step_c = torch.compile(opt.step)

    def step(i):
        xb, yb = xs[i % batches].to(dev), ys[i % batches].to(dev)
        fwd_bwd_c(xb, yb)
        opt_step_c()
        opt.zero_grad()

    breaks0 = graph_breaks()
    sync(dev)
    t0 = time.perf_counter()
    for i in range(warmup):
        step(i)
    sync(dev)
    compile_s = time.perf_counter() - t0
    breaks = graph_breaks() - breaks0
    rate = timed(step, dev, warmup, steps)
    return {"rate": rate, "final": final_params(model), "compile_s": compile_s,
            "graph_breaks": breaks, "warmup": warmup}


def graph_breaks():
    try:
        from torch._dynamo.utils import counters
        return sum(counters["graph_break"].values())
    except Exception:  # noqa: BLE001 - informational only
        return 0


def compiled_train(d, cfg, a, precision, optimizer, x, y):
    impl = COMPILED_IMPL.get(optimizer, "fused")
    try:
        r = compiled_train_once(d, cfg, a, precision, optimizer, x, y, impl)
    except Exception as e:  # noqa: BLE001
        if impl != "fused":
            raise
        print(f"torch.compile of the fused {optimizer} step failed ({type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}); compiling the foreach one",
              file=sys.stderr, flush=True)
        impl = "foreach"
        r = compiled_train_once(d, cfg, a, precision, optimizer, x, y, impl)
    COMPILED_IMPL[optimizer] = impl
    r["impl"] = impl
    return r


def graph_train(d, cfg, a, precision, optimizer, x, y):
    """The whole-network-capture recipe of the PyTorch CUDA-graph docs."""
    sizes, batches, steps, warmup = cfg["sizes"], cfg["batches"], cfg["steps"], cfg["warmup"]
    dev = a.device
    xs, ys = host_batches(x, y, batches)
    model = load_model(d, sizes).to(dev)
    opt = make_optimizer(optimizer, model.parameters(), "fused", capturable=True)
    static_x = xs[0].to(dev).clone()
    static_y = ys[0].to(dev).clone()

    def fwd_bwd_step():
        with autocast(dev, precision, cache_enabled=False):
            out = model(static_x)
        loss = F.cross_entropy(out.float(), static_y)
        loss.backward()
        opt.step()

    # 3 warm-up steps on a side stream (batches 0..2), before the capture.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            static_x.copy_(xs[i % batches])
            static_y.copy_(ys[i % batches])
            opt.zero_grad(set_to_none=True)
            fwd_bwd_step()
    torch.cuda.current_stream().wait_stream(s)

    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        fwd_bwd_step()

    def step(i):
        static_x.copy_(xs[i % batches])
        static_y.copy_(ys[i % batches])
        g.replay()

    for i in range(3, 3 + warmup):
        step(i)
    rate = timed(step, dev, 3 + warmup, steps)
    return {"rate": rate, "final": final_params(model)}


def loom_train(d, cfg, a, precision, optimizer, threads, graph):
    cmd = [a.loom_bin, "--dir", d, "--sizes", ",".join(map(str, cfg["sizes"])),
           "--batch", str(cfg["batch"]), "--batches", str(cfg["batches"]),
           "--precision", precision, "--steps", str(cfg["steps"]),
           "--warmup", str(cfg["warmup"]), "--reps", "1", "--threads", str(threads),
           "--device", a.device, "--optimizer", optimizer]
    if graph:
        cmd += ["--graph", "1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    rates = json.loads(out.stdout)["steps_per_s"]
    final = []
    i = 0
    while os.path.exists(os.path.join(d, f"loom_final_{i}.bin")):
        path = os.path.join(d, f"loom_final_{i}.bin")
        final.append(torch.from_file(path, size=os.path.getsize(path) // 4, dtype=torch.float32))
        os.remove(path)  # the next run (loom-graph or loom) writes its own
        i += 1
    return {"rates": rates, "final": final}


def max_abs_diff(ps, qs):
    if ps is None or qs is None:
        return None
    if len(ps) != len(qs):
        return float("nan")
    return max((p.double().flatten() - q.double().flatten()).abs().max().item()
               for p, q in zip(ps, qs))


def write(path, a, rows):
    doc = {"torch": torch.__version__, "device": a.device,
           "device_name": torch.cuda.get_device_name() if a.device == "cuda" else None,
           "threads": a.threads, "sides": a.sides, "steps_scale": a.steps_scale,
           "optimizers": {k: OPTIMIZERS[k] for k in a.optimizers},
           "loss": "cross_entropy", "rows": rows}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom-bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sizes", default="tiny,medium,large")
    ap.add_argument("--precisions", default="32-true,bf16-mixed")
    ap.add_argument("--optimizers", default="adam")
    ap.add_argument("--sides", default=None,
                    help="loom,eager,compiled (and loom-graph,graph on cuda) by default")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps-scale", type=float, default=1.0)
    a = ap.parse_args()

    all_sides = ["loom", "eager", "compiled"] + (["loom-graph", "graph"]
                                                 if a.device == "cuda" else [])
    a.sides = a.sides.split(",") if a.sides else all_sides
    for s in a.sides:
        if s not in all_sides:
            ap.error(f"--sides: {s} is not one of {','.join(all_sides)} on {a.device}")
    a.optimizers = a.optimizers.split(",")
    for o in a.optimizers:
        if o not in OPTIMIZERS:
            ap.error(f"--optimizers: {o} is not sgd or adam")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")

    warnings.filterwarnings("ignore")
    torch.set_num_threads(a.threads)
    rows = []
    for size in a.sizes.split(","):
        sizes, batch, batches, steps0, warmup0 = SIZES[size]
        cfg = {"sizes": sizes, "batch": batch, "batches": batches,
               "steps": max(1, round(steps0 * a.steps_scale)),
               "warmup": max(1, round(warmup0 * a.steps_scale))}
        reps = a.reps if size != "large" else max(1, a.reps - 1)
        for precision in a.precisions.split(","):
            if size == "large" and precision == "bf16-mixed" and a.device == "cpu":
                continue
            for optimizer in a.optimizers:
                rates = {s: [] for s in a.sides}
                finals = {}
                compile_s, breaks, c_warmup, c_impl = [], [], None, None
                with tempfile.TemporaryDirectory() as d:
                    x, y = write_inputs(d, sizes, batch, batches)
                    for rep in range(reps):
                        k = rep % len(a.sides)
                        for side in a.sides[k:] + a.sides[:k]:
                            if side in ("loom", "loom-graph"):
                                r = loom_train(d, cfg, a, precision, optimizer, a.threads,
                                               side == "loom-graph")
                                rates[side] += r["rates"]
                            else:
                                fn = {"eager": eager_train, "compiled": compiled_train,
                                      "graph": graph_train}[side]
                                r = fn(d, cfg, a, precision, optimizer, x, y)
                                rates[side].append(r["rate"])
                                if side == "compiled":
                                    compile_s.append(r["compile_s"])
                                    breaks.append(r["graph_breaks"])
                                    c_warmup, c_impl = r["warmup"], r["impl"]
                            finals[side] = r["final"]
                best = {s: max(v) for s, v in rates.items()}
                row = {"size": size, "layers": sizes, "batch": batch, "precision": precision,
                       "optimizer": optimizer, "device": a.device, "threads": a.threads,
                       "steps": cfg["steps"], "warmup": cfg["warmup"], "reps": reps}
                for s in a.sides:
                    key = s.replace("-", "_")
                    row[f"{key}_steps_per_s"] = rates[s]
                    row[f"{key}_best"] = best[s]
                if "compiled" in a.sides:
                    row.update({"compiled_warmup": c_warmup, "compiled_optimizer": c_impl,
                                "compile_s": compile_s, "compile_s_first": compile_s[0],
                                "compiled_graph_breaks": breaks})
                ratios, line = {}, []
                for name, (num, den, targets) in RATIOS.items():
                    if num not in best or den not in best:
                        continue
                    value = best[num] / best[den]
                    target = targets.get(size, targets.get(None))
                    ratios[name] = {"value": value, "target": target,
                                    "met": None if target is None else value >= target}
                    mark = "" if target is None else (
                        f" (>={target:g} {'ok' if value >= target else 'MISSED'})")
                    line.append(f"{num}/{den} x{value:.2f}{mark}")
                row["ratios"] = ratios
                row["max_abs_param_diff_loom_vs_eager"] = max_abs_diff(
                    finals.get("loom"), finals.get("eager"))
                row["max_abs_param_diff_loom_graph_vs_eager"] = max_abs_diff(
                    finals.get("loom-graph"), finals.get("eager"))
                rows.append(row)
                write(a.out, a, rows)  # after every row: a stopped run keeps what it measured
                rate_str = "  ".join(f"{s} {best[s]:9.1f}" for s in a.sides)
                if "compiled" in a.sides:
                    rate_str += f" (compile {compile_s[0]:.1f}s, {c_impl})"
                diff = row["max_abs_param_diff_loom_vs_eager"]
                diff_str = f"  max|dp| {diff:.3g}" if diff is not None else ""
                print(f"t{a.threads} {size:6s} {precision:10s} {optimizer:4s} {rate_str}  "
                      + "  ".join(line) + diff_str, file=sys.stderr, flush=True)
    write(a.out, a, rows)


if __name__ == "__main__":
    main()
