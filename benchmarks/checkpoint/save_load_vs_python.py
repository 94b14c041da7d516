"""Saving and loading a 100M-parameter training state: loom against Python, side by side.

  python save_load_vs_python.py --loom-bin build-bench/benchmarks/checkpoint/loom_bench_checkpoint
                                [--dir DIR] [--millions 100] [--reps 3] [--out FILE.json]

The state is the same in both: LAYERS square Linear layers (f32, MILLIONS million parameters)
and their Adam state after one step, 3 x 4 x MILLIONS MB. Each rep runs loom once (a fresh
process: rt.save with {.sync = false}, rt.save, then rt.load into the model and optimizer in
place, then rt.load into the model and a new optimizer without state, as a new process
resumes) and Python once in this process (torch.save({"model": sd, "optimizer": osd}), an
fsync of the file, then torch.load + model.load_state_dict + optimizer.load_state_dict),
the two in alternating order. Both time warm cycles: the loom process runs one untimed
save/load first, and the Python process one untimed rep before the first (a process's first
load of a large file is slower, in both). Both write to DIR and read back what the page
cache holds; every timed write (loom's, Python's, dd's) starts after a sync, with nothing dirty
in the page cache, so that the kernel's writeback of the bytes before does not decide it.
loom's default save fsyncs (its atomic, durable save) and is compared with Python's
torch.save plus an fsync; loom's {.sync = false} save with plain torch.save. The machine's own
limits in the same reps, on the same bytes: dd writing them to the page cache, dd with
conv=fsync, cat reading the file back warm, and (in the loom process) the file read(2) into
fresh memory with and without its CRC-32: the floor of any load that copies. loom's
asynchronous saves (one Checkpoints, {.async = true}) are timed for how long they block the
caller: the first, which allocates the host copy's buffers, and the next, durable one, which
reuses them as a run's saves do; and until that one is written.
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
    os.sync()
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
            "async_first_blocked_s": float(fields["async_first_blocked_s"]),
            "async_blocked_s": float(fields["async_blocked_s"]),
            "async_total_s": float(fields["async_total_s"]), "read_s": float(fields["read_s"]),
            "read_crc_s": float(fields["read_crc_s"]),
            "load_fresh_s": float(fields["load_fresh_s"])}


def timed(cmd, **kw):
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t0


def machine_rep(directory, nbytes):
    """dd of the checkpoint's bytes to the page cache, dd with conv=fsync, a warm cat."""
    path = os.path.join(directory, "dd.bin")
    count = max(1, round(nbytes / (4 << 20)))
    dd = ["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={count}"]
    os.sync()  # every timed write starts with nothing dirty (as loom's and Python's do)
    write_s = timed(dd)
    os.remove(path)
    os.sync()
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
              f"(no sync {loom[-1]['save_nosync_s']:.3f} s) load {loom[-1]['load_s']:.3f} s "
              f"(fresh optimizer {loom[-1]['load_fresh_s']:.3f} s); "
              f"python save {py[-1]['save_s']:.3f} s (+fsync {py[-1]['save_fsync_s']:.3f} s) "
              f"load {py[-1]['load_s']:.3f} s; async blocked: first "
              f"{loom[-1]['async_first_blocked_s']:.3f} s, next (durable) "
              f"{loom[-1]['async_blocked_s']:.3f} s (done {loom[-1]['async_total_s']:.3f} s); "
              f"dd {machine[-1]['dd_s']:.3f} s, "
              f"dd fsync {machine[-1]['dd_fsync_s']:.3f} s, cat {machine[-1]['cat_s']:.3f} s, "
              f"read into fresh memory {loom[-1]['read_s']:.3f} s "
              f"(+ CRC-32 {loom[-1]['read_crc_s']:.3f} s)",
              flush=True)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    result = {
        "millions": a.millions, "layers": a.layers, "reps": a.reps, "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loom": {"save_s": med(loom, "save_s"), "save_nosync_s": med(loom, "save_nosync_s"),
                 "load_s": med(loom, "load_s"), "bytes": loom[0]["bytes"],
                 "async_first_blocked_s": med(loom, "async_first_blocked_s"),
                 "async_blocked_s": med(loom, "async_blocked_s"),
                 "async_total_s": med(loom, "async_total_s"), "read_s": med(loom, "read_s"),
                 "read_crc_s": med(loom, "read_crc_s"),
                 "load_fresh_s": med(loom, "load_fresh_s")},
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
    best = lambda rows, k: min(r[k] for r in rows)  # noqa: E731
    Lb = {k: best(loom, k) for k in ("save_s", "save_nosync_s", "load_s", "read_s", "read_crc_s",
                                      "async_first_blocked_s", "async_blocked_s",
                                      "load_fresh_s")}
    Mb = {k: best(machine, k) for k in ("dd_s", "dd_fsync_s", "cat_s")}
    result["best"] = {"loom": Lb, "machine": Mb}

    def row(what, loom_k, other, other_k, ratio):
        cells = []
        for ls, ms in ((L, other[0]), (Lb, other[1])):
            x, y = ls[loom_k], ms[other_k]
            cells.append(f"{x:.3f} s / {y:.3f} s = {ratio(x, y):.2f}x")
        return f"| {what} | {cells[0]} | {cells[1]} |"

    speed = lambda x, y: y / x  # noqa: E731  (loom's speed as a fraction of the other's)
    time_ratio = lambda x, y: x / y  # noqa: E731
    print("\n| against the machine (loom / the machine) | medians | best of the reps |\n"
          "|---|---|---|\n" + "\n".join([
              row("save without sync vs dd to the page cache (speed)", "save_nosync_s", (M, Mb),
                  "dd_s", speed),
              row("durable save vs dd conv=fsync (time)", "save_s", (M, Mb), "dd_fsync_s",
                  time_ratio),
              row("load vs a warm cat (speed)", "load_s", (M, Mb), "cat_s", speed),
              row("load, the optimizer without state, vs a warm cat (speed)", "load_fresh_s",
                  (M, Mb), "cat_s", speed),
              row("load vs read(2) into fresh memory (speed)", "load_s", (L, Lb), "read_s", speed),
              row("load vs read(2) into fresh memory + CRC-32 (speed)", "load_s", (L, Lb),
                  "read_crc_s", speed),
              row("asynchronous durable save, buffers reused: blocked vs the durable save "
                  "(time)", "async_blocked_s", (L, Lb), "save_s", time_ratio),
              row("the same, blocked vs the save without sync (time)", "async_blocked_s",
                  (L, Lb), "save_nosync_s", time_ratio),
              row("a Checkpoints' first asynchronous save (buffers allocated), no sync: "
                  "blocked vs the save without sync (time)", "async_first_blocked_s", (L, Lb),
                  "save_nosync_s", time_ratio)]) +
          f"\n| asynchronous durable save: until written and synced | "
          f"{L['async_total_s']:.3f} s | |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
