"""Saving and loading a 100M-parameter training state: loom against Python, side by side.

  python save_load_vs_python.py --loom-bin build-bench/benchmarks/checkpoint/loom_bench_checkpoint
                                [--dir DIR] [--millions 100] [--reps 3] [--out FILE.json]

The state is the same in both: LAYERS square Linear layers (f32, MILLIONS million parameters)
and their Adam state after one step, 3 x 4 x MILLIONS MB. Each rep runs loom once (a fresh
process: rt.save with {.sync = false}, rt.save, then rt.load into the model and optimizer in
place) and Python once in this process (torch.save({"model": sd, "optimizer": osd}), an
fsync of the file, then torch.load + model.load_state_dict + optimizer.load_state_dict),
the two in alternating order. Both time warm cycles: the loom process runs one untimed
save/load first, and the Python process one untimed rep before the first (a process's first
load of a large file is slower, in both). Both write to DIR and read back what the page
cache holds.
loom's default save fsyncs (its atomic, durable save) and is compared with Python's
torch.save plus an fsync; loom's {.sync = false} save with plain torch.save. The machine's own
limits in the same reps, on the same bytes: dd writing them to the page cache, dd with
conv=fsync, and cat reading the file back warm. loom's asynchronous save (Checkpoints with
{.async = true}) is timed for how long it blocks the caller and until its write is done.
Prints the tables and writes the rows as JSON.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import time

import torch


def python_rep(path, millions, layers):
    width = int(math.sqrt(millions * 1e6 / layers))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    t0 = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    t1 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    t2 = time.perf_counter()
    ck = torch.load(path)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    t3 = time.perf_counter()
    size = os.path.getsize(path)
    os.remove(path)
    return {"save_s": t1 - t0, "save_fsync_s": t2 - t0, "load_s": t3 - t2, "bytes": size}


def loom_rep(binary, directory, millions, layers):
    out = subprocess.run([binary, directory, str(millions), str(layers)], check=True,
                         capture_output=True, text=True, env=dict(os.environ)).stdout
    line = next(l for l in out.splitlines() if l.startswith("loom "))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    return {"save_s": float(fields["save_s"]), "save_nosync_s": float(fields["save_nosync_s"]),
            "load_s": float(fields["load_s"]), "bytes": int(fields["bytes"]),
            "async_blocked_s": float(fields["async_blocked_s"]),
            "async_total_s": float(fields["async_total_s"])}


def timed(cmd, **kw):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t0


def machine_rep(directory, nbytes):
    """dd of the checkpoint's bytes to the page cache, dd with conv=fsync, a warm cat."""
    path = os.path.join(directory, "dd.bin")
    count = max(1, round(nbytes / (4 << 20)))
    dd = ["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={count}"]
    write_s = timed(dd)
    os.remove(path)
    fsync_s = timed(dd + ["conv=fsync"])
    timed(["cat", path])  # warm
    with open(os.devnull, "wb") as null:
        t0 = time.perf_counter()
        subprocess.run(["cat", path], check=True, stdout=null)
        cat_s = time.perf_counter() - t0
    os.remove(path)
    return {"dd_s": write_s, "dd_fsync_s": fsync_s, "cat_s": cat_s}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom-bin", required=True)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--millions", type=float, default=100)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    loom, py, machine = [], [], []
    python_rep(os.path.join(a.dir, "python_state.pt"), a.millions, a.layers)  # warm-up
    for rep in range(a.reps):
        run_loom = lambda: loom.append(loom_rep(a.loom_bin, a.dir, a.millions, a.layers))  # noqa: E731
        run_py = lambda: py.append(  # noqa: E731
            python_rep(os.path.join(a.dir, "python_state.pt"), a.millions, a.layers))
        for run in ((run_loom, run_py) if rep % 2 == 0 else (run_py, run_loom)):
            run()
        machine.append(machine_rep(a.dir, loom[-1]["bytes"]))
        print(f"rep {rep}: loom save {loom[-1]['save_s']:.3f} s "
              f"(no sync {loom[-1]['save_nosync_s']:.3f} s) load {loom[-1]['load_s']:.3f} s; "
              f"python save {py[-1]['save_s']:.3f} s (+fsync {py[-1]['save_fsync_s']:.3f} s) "
              f"load {py[-1]['load_s']:.3f} s; async blocked {loom[-1]['async_blocked_s']:.3f} s "
              f"(done {loom[-1]['async_total_s']:.3f} s); dd {machine[-1]['dd_s']:.3f} s, "
              f"dd fsync {machine[-1]['dd_fsync_s']:.3f} s, cat {machine[-1]['cat_s']:.3f} s",
              flush=True)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    result = {
        "millions": a.millions, "layers": a.layers, "reps": a.reps, "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loom": {"save_s": med(loom, "save_s"), "save_nosync_s": med(loom, "save_nosync_s"),
                 "load_s": med(loom, "load_s"), "bytes": loom[0]["bytes"],
                 "async_blocked_s": med(loom, "async_blocked_s"),
                 "async_total_s": med(loom, "async_total_s")},
        "machine": {"dd_s": med(machine, "dd_s"), "dd_fsync_s": med(machine, "dd_fsync_s"),
                    "cat_s": med(machine, "cat_s")},
        "python": {"save_s": med(py, "save_s"), "save_fsync_s": med(py, "save_fsync_s"),
                   "load_s": med(py, "load_s"), "bytes": py[0]["bytes"]},
        "raw": {"loom": loom, "python": py, "machine": machine},
    }
    L, P = result["loom"], result["python"]
    print(f"\n| {a.millions:g}M params + Adam ({L['bytes'] / 1e9:.2f} GB) | loom | Python | "
          f"Python / loom |\n|---|---|---|---|\n"
          f"| save, durable (loom's default; Python + fsync) | {L['save_s']:.3f} s | "
          f"{P['save_fsync_s']:.3f} s | {P['save_fsync_s'] / L['save_s']:.2f}x |\n"
          f"| save, no sync (loom {{.sync = false}}; torch.save) | {L['save_nosync_s']:.3f} s | "
          f"{P['save_s']:.3f} s | {P['save_s'] / L['save_nosync_s']:.2f}x |\n"
          f"| load into model + optimizer | {L['load_s']:.3f} s | {P['load_s']:.3f} s | "
          f"{P['load_s'] / L['load_s']:.2f}x |")
    M = result["machine"]
    print(f"\n| against the machine | loom | the machine | ratio |\n|---|---|---|---|\n"
          f"| save without sync vs dd to the page cache | {L['save_nosync_s']:.3f} s | "
          f"{M['dd_s']:.3f} s | {M['dd_s'] / L['save_nosync_s']:.2f}x dd's speed |\n"
          f"| durable save vs dd conv=fsync | {L['save_s']:.3f} s | {M['dd_fsync_s']:.3f} s | "
          f"{L['save_s'] / M['dd_fsync_s']:.2f}x dd's time |\n"
          f"| load vs a warm cat | {L['load_s']:.3f} s | {M['cat_s']:.3f} s | "
          f"{M['cat_s'] / L['load_s']:.2f}x cat's speed |\n"
          f"| asynchronous save: time blocked vs the save without sync | "
          f"{L['async_blocked_s']:.3f} s | {L['save_nosync_s']:.3f} s | "
          f"{L['async_blocked_s'] / L['save_nosync_s']:.2f}x |\n"
          f"| asynchronous save: until written | {L['async_total_s']:.3f} s | | |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
