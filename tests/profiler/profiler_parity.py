"""loom::Profiler against torch.profiler, on the same model and schedule.

Python trains an MLP (Linear(16, 32), ReLU, Linear(32, 4)) 12 steps with AdamW(fused=True)
under torch.profiler.profile(schedule=schedule(wait=1, warmup=1, active=2, repeat=2)),
exporting each window's Chrome trace; loom_profiler_tool does the same with loom's fused
AdamW under loom::Profiler. Both sets of traces are read as JSON: the same number of windows
(steps 2-3 and 6-7), each trace holding exactly its window's ProfilerStep#N scopes (nothing
recorded outside the active windows), and in every recorded step the same aten:: operators
with the same call counts. loom's RecordFunction scope is in its traces; its key-averages
table has Python's columns. Then 2 ranks under loom::Ddp (torchrun, gloo): one trace per rank
and window, each naming its rank in distributedInfo. First, loom::ProfilerSchedule gives
every step of several schedules the action torch.profiler.schedule gives it, and refuses
what Python refuses.

Usage: python profiler_parity.py --tool BIN --dir DIR
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dist"))
import launch  # noqa: E402  (torchrun with retries, free ports)

SCHEDULE = dict(wait=1, warmup=1, active=2, repeat=2)
STEPS = 12


def python_traces(out):
    """Python's run: each window's trace as out/rank-0.step-N.pt.trace.json."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    xs = [torch.randn(8, 16) for _ in range(STEPS)]
    ys = [torch.randint(0, 4, (8,)) for _ in range(STEPS)]
    out.mkdir(parents=True, exist_ok=True)

    def ready(p):
        # step_num is the step after the window; loom names the window's last
        p.export_chrome_trace(str(out / f"rank-0.step-{p.step_num - 1}.pt.trace.json"))

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(**SCHEDULE),
                                on_trace_ready=ready) as prof:
        for x, y in zip(xs, ys):
            opt.zero_grad()
            with torch.profiler.record_function("loom_forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            prof.step()


def read_trace(path):
    """The ProfilerStep#N scopes of a trace, the aten:: operators inside each (name -> count),
    and the user scopes' names."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    steps = {}
    for e in events:
        m = re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))
        if m and e.get("ph") == "X":
            steps[int(m.group(1))] = (e["ts"], e["ts"] + e["dur"], Counter())
    outside = Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or e.get("cat") != "cpu_op" or not name.startswith("aten::"):
            continue
        for first, last, ops in steps.values():
            if first <= e["ts"] <= last:
                ops[name] += 1
                break
        else:
            outside[name] += 1
    scopes = {e.get("name") for e in events if e.get("cat") == "user_annotation"}
    return {n: ops for n, (_, _, ops) in steps.items()}, outside, scopes, events


def traces_of(d):
    return sorted(d.glob("*.pt.trace.json"), key=lambda p: int(re.search(r"step-(\d+)", p.name)[1]))


def schedules(tool):
    """loom's schedule against Python's, step by step."""
    from torch.profiler import schedule
    cases = [(1, 1, 2, 2, 0, 0), (0, 1, 1, 0, 0, 0), (2, 0, 3, 1, 3, 0), (5, 2, 2, 3, 2, 1),
             (3, 1, 1, 0, 4, 1), (0, 0, 1, 0, 0, 0)]
    for wait, warmup, active, repeat, skip_first, skip_first_wait in cases:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warmup=0's warning
            fn = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat,
                          skip_first=skip_first, skip_first_wait=skip_first_wait)
        want = [fn(s).name for s in range(40)]
        r = subprocess.run([tool, "schedule", *map(str, (wait, warmup, active, repeat, skip_first,
                                                          skip_first_wait, 40))],
                           capture_output=True, text=True, timeout=60)
        got = r.stdout.split()
        if got != want:
            raise SystemExit(f"profiler parity: schedule{(wait, warmup, active, repeat, skip_first, skip_first_wait)}: "
                             f"loom {got}, Python {want}")
    r = subprocess.run([tool, "schedule", "1", "1", "0", "0", "0", "0", "4"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 1 or "active=0 (need > 0)" not in r.stdout:
        raise SystemExit(f"profiler parity: active=0 was not refused: {r.stdout}{r.stderr}")
    print(f"profiler parity: {len(cases)} schedules give Python's action at each of 40 steps; "
          f"active=0 refused: {r.stdout.strip()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    schedules(a.tool)
    python_traces(d / "python")
    r = subprocess.run([a.tool, str(d / "loom")], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        raise SystemExit(f"profiler parity: loom_profiler_tool failed: {r.stdout}{r.stderr}")
    print(r.stdout, end="")
    py, lm = traces_of(d / "python"), traces_of(d / "loom")
    print(f"profiler parity: Python wrote {[p.name for p in py]}, loom {[p.name for p in lm]}")
    if [p.name for p in py] != [p.name for p in lm] or len(lm) != 2:
        raise SystemExit("profiler parity: the windows differ")
    for p, q in zip(py, lm):
        psteps, _, _, _ = read_trace(p)
        lsteps, outside, scopes, events = read_trace(q)
        if sorted(psteps) != sorted(lsteps):
            raise SystemExit(f"profiler parity: {q.name} records steps {sorted(lsteps)}, "
                             f"Python's {sorted(psteps)}")
        for n in sorted(lsteps):
            if psteps[n] != lsteps[n]:
                only = (psteps[n] - lsteps[n]) + (lsteps[n] - psteps[n])
                raise SystemExit(f"profiler parity: step {n}: the aten:: calls differ: Python "
                                 f"{dict(psteps[n])}, loom {dict(lsteps[n])} (apart: {dict(only)})")
        if "loom_forward" not in scopes:
            raise SystemExit(f"profiler parity: {q.name} lacks the RecordFunction scope")
        if outside:
            raise SystemExit(f"profiler parity: {q.name} has aten:: calls outside its steps: "
                             f"{dict(outside)}")
        n = sorted(lsteps)[0]
        print(f"profiler parity: {q.name}: steps {sorted(lsteps)}, each the same "
              f"{sum(lsteps[n].values())} aten:: calls of {len(lsteps[n])} operators as "
              f"Python's ({', '.join(f'{k} x{v}' for k, v in sorted(lsteps[n].items())[:4])}, "
              f"...); {len(events)} events; scope loom_forward present")
    heads = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg",
             "# of Calls"]
    table = r.stdout[r.stdout.index("traces\n"):]
    if not all(h in table for h in heads) or not re.search(r"aten::addmm\s.*\s4\s*$", table, re.M):
        raise SystemExit(f"profiler parity: the table lacks Python's columns or addmm x4:\n{table}")
    print("profiler parity: the key-averages table has Python's columns (addmm: 4 calls in the "
          "window of 2 steps)")

    out = launch.torchrun(["--no-python", a.tool, str(d / "ddp"), "ddp"], 2,
                          "loom_profiler_tool under Ddp on 2 ranks", attempts=3, test="profiler")
    names = sorted(p.name for p in (d / "ddp").glob("*.pt.trace.json"))
    want = sorted(f"rank-{r}.step-{s}.pt.trace.json" for r in (0, 1) for s in (3, 7))
    if names != want:
        raise SystemExit(f"profiler parity: Ddp's ranks wrote {names}, not {want}")
    for rank in (0, 1):
        trace = json.loads((d / "ddp" / f"rank-{rank}.step-3.pt.trace.json").read_text())
        info = trace.get("distributedInfo", {})
        if info.get("rank") != rank or info.get("world_size") != 2:
            raise SystemExit(f"profiler parity: rank {rank}'s trace says {info}")
    print(f"profiler parity: Ddp on 2 ranks: {', '.join(names)}, each naming its rank")
    print("profiler parity: ok")


if __name__ == "__main__":
    main()
