#!/usr/bin/env python3
"""Writes docs/benchmarks.md and docs/benchmarks/benchmarks.png from the raw JSON that
scripts/run_benchmarks.sh leaves in docs/benchmarks/. Missing parts are reported as such.

Each part names the machine, date and load of its own results: the "provenance" object of its
JSON ({"machine", "date", "load", optionally "commit"}; a Google Benchmark file's "context"
gives the date and load). What a JSON does not hold is printed as "not recorded"; nothing on
the page is taken from the machine that runs this script, which may not be the one that
measured. Called by scripts/run_benchmarks.sh (--seconds > 0), it first gives each result
file that run wrote (modified in the last --seconds seconds) and that has no provenance yet
this machine's CPU model, the file's time and the load that docs/benchmarks/load.txt recorded
for its part. A part's run-specific remarks belong in its JSON's "note".

    python3 benchmarks/report.py --raw docs/benchmarks --out docs/benchmarks.md [--no-plot]
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import time


def load(raw, name):
    p = os.path.join(raw, name)
    return json.load(open(p)) if os.path.exists(p) else None


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def ok(flag):
    return "met" if flag else "**missed**"


# The line of docs/benchmarks/load.txt that scripts/run_benchmarks.sh writes before each part.
LOAD_LINE = {
    "overhead_callgrind.json": "before", "overhead_wall.json": "overhead wall run",
    "hook_dispatch.json": "overhead wall run", "fabric_vs_loom.json": "fabric run",
    "optim_vs_fabric.json": "optim run", "compile_time.json": "compile-time run",
    "ddp_vs_python.json": "ddp run", "raw_vs_loom.json": "raw run",
    "contention.json": "contention run",
}


def stamp_new(raw, seconds):
    """Gives the result files of the run that just ended (modified in the last `seconds`) and
    without a "provenance" this machine's CPU, the file's time and its part's load."""
    loads = {}
    p = os.path.join(raw, "load.txt")
    for line in (open(p).read().splitlines() if os.path.exists(p) else []):
        label, _, rest = line.partition(":")
        m = re.search(r"load average: ([0-9.]+)", rest)
        if m:
            loads[label.strip()] = m.group(1)
    since = time.time() - seconds - 60
    for name in sorted(os.listdir(raw)):
        path = os.path.join(raw, name)
        if not name.endswith(".json") or os.path.getmtime(path) < since:
            continue
        doc = json.load(open(path))
        if not isinstance(doc, dict) or "provenance" in doc:
            continue
        prov = {"machine": f"{cpu_model()}, nproc {os.cpu_count()}"}
        if "context" not in doc:  # Google Benchmark's context has the date and load
            prov["date"] = datetime.datetime.fromtimestamp(os.path.getmtime(path)).strftime(
                "%Y-%m-%d %H:%M")
            prov["load"] = loads.get(LOAD_LINE.get(name, ""), "not recorded")
        if name == "overhead_callgrind.json":
            prov["valgrind"] = sh("valgrind --version") or "not recorded"
        with open(path, "w") as f:
            json.dump({"provenance": prov, **doc}, f, indent=1)


def provenance(doc):
    """The machine, date and load recorded with a part's results, as a sentence."""
    prov = dict((doc or {}).get("provenance") or {})
    ctx = (doc or {}).get("context") or {}  # Google Benchmark's own record
    if "date" not in prov and ctx.get("date"):
        prov["date"] = ctx["date"][:16].replace("T", " ")
    if "load" not in prov and ctx.get("load_avg"):
        prov["load"] = f"{ctx['load_avg'][0]:.2f}"
    machine = prov.get("machine", "machine not recorded")
    date = prov.get("date", "date not recorded")
    load = prov.get("load", "not recorded")
    text = f"Measured {date} on {machine}; load average {load}"
    if prov.get("commit"):
        text += f"; results recorded in commit {prov['commit']}"
    return text + "."


def profile_figures(text):
    """From optim_profile.md: per section (precision, ATen share of the profiled step, the
    ceiling, the share of mm + addmm in the ATen time)."""
    out = []
    for sec in text.split("#### ")[1:]:
        head = sec.splitlines()[0]
        step = re.search(r"\(([0-9.]+) us profiled\).*?summed\): ([0-9.]+) us", sec)
        ceil = re.search(r"the ATen time: ([0-9.]+)x", sec)
        total = re.search(r"\| all \d+ kinds \| \d+ \| ([0-9.]+) \|", sec)
        gemm = sum(float(v) for v in re.findall(r"\| `aten::(?:mm|addmm)` \| \d+ \| ([0-9.]+) \|", sec))
        if not (step and ceil and total):
            continue
        out.append({"precision": head.split(",")[1].strip(),
                    "aten_share": float(step.group(2)) / float(step.group(1)),
                    "ceiling": float(ceil.group(1)),
                    "gemm_share": gemm / float(total.group(1))})
    return out


def span(values, fmt):
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--no-plot", action="store_true", help="write the page only")
    a = ap.parse_args()
    if a.seconds > 0:
        stamp_new(a.raw, a.seconds)
    cg = load(a.raw, "overhead_callgrind.json")
    wall = load(a.raw, "overhead_wall.json")
    hooks = load(a.raw, "hook_dispatch.json")
    fab = load(a.raw, "fabric_vs_loom.json")
    # Extra Fabric runs, e.g. fabric_vs_loom_threads1.json: rendered after the main table.
    extra = [(n, load(a.raw, n)) for n in sorted(os.listdir(a.raw))
             if n.startswith("fabric_vs_loom_") and n.endswith(".json")]
    ct = load(a.raw, "compile_time.json")
    ddp = load(a.raw, "ddp_vs_python.json")
    ovf = load(a.raw, "optim_vs_fabric.json")
    raw_eager = load(a.raw, "raw_vs_loom.json")
    contention = load(a.raw, "contention.json")
    # Part 5 is measured by hand (benchmarks/precision/conv_cpu.cpp): keep what the page says.
    kept5 = ""
    if os.path.exists(a.out):
        old = open(a.out).read()
        start5, end5 = old.find("## 5. Each precision on the CPU"), old.find("## 6. ")
        if end5 < 0:
            end5 = old.find("## How to run")
        if start5 >= 0 and end5 > start5:
            kept5 = old[start5:end5].rstrip() + "\n"
    loadtxt = open(os.path.join(a.raw, "load.txt")).read().strip() if os.path.exists(
        os.path.join(a.raw, "load.txt")) else "not recorded"
    docs = [cg, wall, hooks, fab, ct, ddp, ovf, raw_eager, contention] + [d for _, d in extra]
    provs = [d["provenance"] for d in docs if d and d.get("provenance")]
    machines = sorted({p["machine"] for p in provs if p.get("machine")})
    dates = sorted(p["date"][:10] for p in provs if p.get("date"))

    L = []
    w = L.append
    w("# Benchmarks")
    w("")
    w("Written by `benchmarks/report.py` from the raw results in `docs/benchmarks/` (`*.json`, "
      "`optim_profile.md`, `load.txt`); `scripts/run_benchmarks.sh` measures the parts and then "
      "runs it, and a part it skips keeps its earlier results" +
      (f" (its last run took {a.seconds} s)" if a.seconds > 0 else "") +
      ". So the parts need not come from one machine or one day: each names the machine, date "
      "and load recorded with its results. Plot: `docs/benchmarks/benchmarks.png`. Nothing here "
      "is part of the test suite.")
    w("")
    w("## Machines")
    w("")
    if machines:
        w(f"- machines named by the parts' results: {'; '.join(machines)}" +
          (f"; dates from {dates[0]} to {dates[-1]}" if dates else ""))
    w("- compiler: " + (f"{ct['compiler']} (part 4's record)" if ct and ct.get("compiler")
                        else "not recorded") +
      "; build type Release (-O3), plus -g for the overhead binary")
    torches = sorted({d["torch"] for d in docs if d and d.get("torch")})
    w("- torch " + (", ".join(torches) if torches else "not recorded") +
      " (LibTorch from the same wheel)" +
      (f"; lightning {fab['lightning']}" if fab and fab.get("lightning") else ""))
    w("- load (`uptime`) at each step of the last `scripts/run_benchmarks.sh` run "
      "(`docs/benchmarks/load.txt`; it covers the parts that run measured):")
    w("")
    w("```")
    w(loadtxt)
    w("```")
    w("")
    w("A load average above the machine's core count makes wall-time figures noisy; "
      "instruction counts (callgrind) and GCC's allocated memory do not depend on the load.")
    w("")

    # 1. overhead
    w("## 1. Overhead against hand-written LibTorch")
    w("")
    if cg or wall:
        same = cg and wall and provenance(cg) == provenance(wall)
        if same or not wall:
            w(provenance(cg))
        elif not cg:
            w(provenance(wall))
        else:
            w(f"Instruction counts: {provenance(cg)} Times: {provenance(wall)}")
        w("")
    w("`benchmarks/overhead/overhead.cpp`: one training step of an MLP (" +
      ((cg or wall or {}).get("model", "?")) + ", fixed seed, 8 fixed batches, one torch "
      "thread), written three ways: *hand* (plain LibTorch: `.to` casts for -true; "
      "`at::autocast` get/set, `increment_nesting`/`decrement_nesting`, `clear_cache` for "
      "-mixed; `at::_amp_foreach_non_finite_check_and_unscale_` and `at::_amp_update_scale_` "
      "for 16-mixed), *loom* (`loom::Runtime<loom::Cpu, P>`: `to_device`, `forward`, "
      "`backward`, `optimizer_step`) and *virtual* (the same hooks behind virtual functions, "
      "`benchmarks/overhead/virtual_plugins.hpp`). The three train separate copies of the same "
      "model and end with bit-identical parameters (last column).")
    w("")
    if cg:
        vg = (cg.get("provenance") or {}).get("valgrind")
        w("Instructions per step (callgrind" + (f" of {vg}" if vg else "") + ", " +
          str(cg["results"][0]["steps"]) +
          " steps after 5 warm-up steps, counted from `CALLGRIND_ZERO_STATS` to "
          "`CALLGRIND_DUMP_STATS_AT` around the steps only). Target: loom/hand <= 1.005.")
        w("")
        w("| precision | hand Ir/step | loom Ir/step | virtual Ir/step | loom/hand | target | "
          "virtual/hand | max abs diff loom vs hand |")
        w("|---|---:|---:|---:|---:|---|---:|---:|")
        for r in cg["results"]:
            w(f"| {r['precision']} | {r['hand_ir_per_step']:,.0f} | {r['loom_ir_per_step']:,.0f} | "
              f"{r['virtual_ir_per_step']:,.0f} | {r['loom_over_hand']:.4f} | "
              f"{ok(r['loom_over_hand'] <= 1.005)} | {r['virtual_over_hand']:.4f} | "
              f"{r['max_abs_diff_loom_hand']:g} |")
        w("")
        lowest = min(r["loom_over_hand"] for r in cg["results"])
        w((f"The lowest ratio here is {lowest:.4f}: the same binary's counts move a little from "
           "run to run (allocator state, lazily built caches), so a ratio can fall below 1. "
           if lowest < 1 else "") +
          "The functions whose own instruction "
          "count differs most between the loom and hand profiles, per step (positive: loom "
          "executes more), are listed below; they are inlining differences (the same ATen "
          "calls attributed to a loom frame instead of the caller) rather than extra work:")
        w("")
        def symbol(name):
            # Function names as `f()` (Doxygen, which builds docs/ into the API reference,
            # reads a bare `..._::call` as a link request); an unnamed frame as (unnamed).
            base = name.split("(")[0]
            return f"`{base}()`" if base else "(unnamed)"

        for r in cg["results"]:
            top = ", ".join(f"{symbol(d['function'])} {d['loom_minus_hand']:+,.0f}"
                            for d in r["largest_exclusive_deltas_per_step"][:4])
            w(f"- {r['precision']}: {top}")
        w("")
    else:
        w("No callgrind results (valgrind missing).")
        w("")
    if wall:
        w("Time per step, native run: " + str(len(wall["results"])) + " precisions; per "
          "precision 21 rounds of 40 steps per implementation, the order rotating each round; "
          "medians. *CPU* is the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), which excludes "
          "time the scheduler gave to other processes; the ratios are medians of per-round "
          "ratios.")
        w("")
        w("| precision | hand µs | loom µs | virtual µs | loom/hand wall | loom/hand CPU | "
          "virtual/hand wall | virtual/hand CPU |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in wall["results"]:
            w(f"| {r['precision']} | {r['hand_ns_per_step'] / 1e3:.1f} | "
              f"{r['loom_ns_per_step'] / 1e3:.1f} | {r['virtual_ns_per_step'] / 1e3:.1f} | "
              f"{r['loom_over_hand']:.3f} | {r['loom_over_hand_cpu']:.3f} | "
              f"{r['virtual_over_hand']:.3f} | {r['virtual_over_hand_cpu']:.3f} |")
        w("")

    # 2. hooks
    w("## 2. Static against virtual dispatch")
    w("")
    if hooks:
        w(provenance(hooks))
        w("")
        reps = sorted({b.get("repetitions") for b in hooks["benchmarks"] if b.get("repetitions")})
        w("`benchmarks/overhead/hook_dispatch.cpp` (Google Benchmark, median of "
          f"{'/'.join(map(str, reps)) or '?'} repetitions): "
          "one hook call through `loom::Runtime`'s policy (static, inlined) and through a "
          "`PrecisionPlugin*` made by an out-of-line factory (virtual). A virtual "
          "`forward_context` has to return a heap-allocated scope object.")
        w("")
        w("| hook | precision | static ns | virtual ns | virtual - static ns |")
        w("|---|---|---:|---:|---:|")
        med = {}
        for b in hooks["benchmarks"]:
            if b.get("aggregate_name") == "median":
                med[b["run_name"]] = b["real_time"] if b["time_unit"] == "ns" else b["real_time"] * (
                    1e3 if b["time_unit"] == "us" else 1e6)
        for name, t in med.items():
            kind, hook, prec = name.split("/")
            if kind != "static":
                continue
            v = med.get(f"virtual/{hook}/{prec}")
            if v is not None:
                w(f"| {hook} | {prec} | {t:.1f} | {v:.1f} | {v - t:+.1f} |")
        w("")
    if cg:
        w("Per training step (callgrind, table 1): virtual - hand = " + ", ".join(
            f"{r['precision']} {r['virtual_minus_hand_ir_per_step']:+,.0f}"
            for r in cg["results"]) + " instructions per step, against loom - hand = " +
          ", ".join(f"{r['precision']} {r['loom_minus_hand_ir_per_step']:+,.0f}"
                    for r in cg["results"]) + ". A step makes about ten hook calls; their "
          "dispatch costs some tens of nanoseconds in all, below the run-to-run noise of a step "
          "that executes about a million instructions of ATen code. What static dispatch buys is "
          "measurable per hook call (the table above), not per step of a real model.")
        w("")

    # 3. fabric
    w("## 3. loom against Lightning Fabric")
    w("")
    if fab:
        w(provenance(fab))
        w("")
        w(f"`benchmarks/fabric/fabric_vs_loom.py`: the same MLP, initial weights and batches "
          f"(written by the python side as raw files, read by `loom_fabric_train`), "
          f"{fab['optimizer']}, {fab['loss']}, the same step count; Fabric(accelerator=\"cpu\", "
          f"devices=1, precision=...) in python against `loom::Runtime<loom::Cpu, P>`; "
          f"torch threads = {fab['threads']} on both sides. Each step: to_device(batch), "
          "forward, loss, backward, optimizer step, zero_grad. Reps alternate between the two "
          "sides; best steps/s of the reps. Targets: >= 3x on tiny, >= 1.0x on large.")
        w("")
        for title, doc in [("", fab)] + [(n, d) for n, d in extra]:
            if title:
                mine, base = doc.get("provenance") or {}, fab.get("provenance") or {}
                other = [k for k in ("machine", "date") if mine.get(k) != base.get(k)]
                w(f"Also `docs/benchmarks/{title}`: torch threads = {doc['threads']} on both "
                  f"sides. {provenance(doc)}" +
                  (f" Not the run of the table above: another {' and '.join(other)}."
                   if other else "") +
                  (f" Note: {doc['note']}." if doc.get("note") else ""))
                w("")
            w("| size | layers, batch | precision | loom steps/s | Fabric steps/s | loom/Fabric | "
              "target | max abs param diff |")
            w("|---|---|---|---:|---:|---:|---|---:|")
            for r in doc["results"]:
                target = {"tiny": 3.0, "large": 1.0}.get(r["size"])
                t = f">= {target:g}x {ok(r['speedup'] >= target)}" if target else "-"
                w(f"| {r['size']} | {'-'.join(map(str, r['layers']))}, {r['batch']} | "
                  f"{r['precision']} | {r['loom_best']:.1f} | {r['fabric_best']:.1f} | "
                  f"{r['speedup']:.2f} | {t} | {r['max_abs_param_diff']:.3g} |")
            w("")
        if fab.get("note"):
            w(f"Note: {fab['note']}.")
            w("")
        w("The final parameters are compared after the same number of steps from the same "
          "weights. Both sides run the same ATen kernels in the same order (Fabric's "
          "`convert_input`, autocast scope and `convert_output` are what loom's policies do), so "
          "a difference of 0 is expected; a nonzero one would come from a different kernel "
          "choice or reduction order, e.g. from differing thread counts.")
        w("")
    else:
        w("Not run: the `lightning` package is not installed in loom's venv "
          "(`scripts/run_benchmarks.sh --install-lightning`).")
        w("")

    # 4. compile time
    w("## 4. Compile time")
    w("")
    if ct:
        w(provenance(ct) + (f" Note: {ct['note']}." if ct.get("note") else ""))
        w("")
        ggc = "ratio_ggc" in ct
        w(f"`benchmarks/compile_time/loom_tu.cpp` instantiates `Runtime` for {ct['pairs']} "
          f"runtimes ({' and '.join(ct['devices'])} x the 7 precisions, and "
          "`Runtime<Cpu, Fp32, Ddp>`) and calls setup, to_device, forward, backward and "
          "optimizer_step on each; `hand_tu.cpp` writes the same steps by hand on the same "
          f"{ct['torch_headers']} torch headers loom's {len(ct['loom_headers'])} headers include "
          "(the device and dtype as run-time arguments, as a person would; fp8 as an autograd "
          "function over `at::_scaled_mm`, data parallelism as a call of an all-reduce compiled "
          f"elsewhere). {ct['compiler']}, `{ct['flags']}`, best of {len(ct['runs']['loom'])}. "
          "Targets: <= 1.10 by GCC's `-ftime-report` total of allocated memory (GGC: the same "
          "source gives the same figure on every run, whatever the load), <= 1.15 by time.")
        w("")
        w("| TU | GGC MiB (-ftime-report) | CPU s (user+sys) | wall s |")
        w("|---|---:|---:|---:|")
        for k in ("loom", "hand"):
            g = f"{ct['best'][k]['ggc_kb'] / 1024:.0f}" if ggc else "-"
            w(f"| {k} | {g} | {ct['best'][k]['cpu_s']:.2f} | {ct['best'][k]['wall_s']:.2f} |")
        g = (f"**{ct['ratio_ggc']:.3f}** ({ok(ct['ratio_ggc'] <= 1.10)})" if ggc else "-")
        w(f"| **loom/hand** | {g} | **{ct['ratio_cpu']:.3f}** ({ok(ct['ratio_cpu'] <= 1.15)}) | "
          f"{ct['ratio_wall']:.3f} |")
        w("")
        core = ct.get("core_once_per_build") or {}
        if core:
            w("loom's compiled core (built into `loom::loom`: the non-template code "
              "of fp8, the GradScaler, the optimizer table and gradient clipping) is compiled once per build with "
              "the same flags, not in every training TU, and is not in the ratio:")
            w("")
            w("| compiled once | GGC MiB (-ftime-report) | CPU s (user+sys) | wall s |")
            w("|---|---:|---:|---:|")
            for f, r in core.items():
                w(f"| `{f}` | {r['ggc_kb'] / 1024:.0f} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} |")
            total = sum(r["cpu_s"] for r in core.values())
            w(f"| all | | {total:.2f} | |")
            w("")
            w(("The training TU costs less than the hand-written one: the hand-written TU "
               "carries its own fp8 autograd function and loss-scaling code, which loom's TU "
               "takes from the library. " if ct["ratio_cpu"] < 1 and ct.get("ratio_ggc", 0) < 1
               else "") +
              "A project with one training TU pays the core once more on a clean "
              f"build (about {total:.0f} s of CPU here); every rebuild of a training TU after "
              "that saves the difference.")
            w("")
        w("Commands, from the repository root (`$TORCH` is the torch wheel's package folder, "
          "`<gen>` a temporary folder in which `measure.py` writes `torch_headers.hpp`: every "
          "torch header that `include/loom` includes):")
        w("")
        w("```")
        w(ct["loom_cmd"])
        w(ct["hand_cmd"])
        if core:
            w(ct["core_cmd"])
        w("```")
        w("")

    if kept5:
        w(kept5)

    # 6. loom::Ddp against Python's DistributedDataParallel: what DDP costs.
    w("## 6. What DDP costs: loom::Ddp and Python DDP")
    w("")
    if ddp:
        w(provenance(ddp))
        w("")
        pinned = (f", each rank pinned to half of the {ddp['cores']} cores" if ddp.get("pinned")
                  else "")
        w(f"`benchmarks/ddp/ddp_vs_python.py`: {ddp['ranks']} ranks on one machine, "
          f"{ddp['backend']}, CPU, {ddp['threads_per_rank']} compute thread per rank{pinned}, "
          "both started by torchrun; the MLPs of part 3, SGD with momentum; ms per step of rank "
          f"0 between two barriers, best of interleaved runs of every variant "
          f"({ddp.get('reps_note', ddp['reps'])}). "
          "*Tax*: the step minus the same step with every backward under `no_backward_sync` "
          "(Python: `no_sync()`), the price of synchronizing; target loom's <= Python's. "
          "*Bound*: loom's step / (its no-sync step + the reducer's bucket all-reduces run "
          "alone, one after another, `loom_bench_ddp --mode buckets`); target <= 1.10, below 1 "
          "when communication overlaps the backward pass.")
        w("")
        w("| model | layers, batch | precision | loom step ms | no-sync ms | tax ms | Python step "
          "ms | no-sync ms | tax ms | loom tax / Python's | target | buckets alone ms | bound "
          "| target |")
        w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
        for r in ddp["rows"]:
            tr = r["loom_tax_ms"] / r["python_tax_ms"] if r["python_tax_ms"] > 0 else float("inf")
            w(f"| {r['size']} | {r['layers'].replace(',', '-')}, {r['batch']} | {r['precision']} | "
              f"{r['loom_ms']:.3f} | {r['loom_nosync_ms']:.3f} | {r['loom_tax_ms']:.3f} | "
              f"{r['python_ms']:.3f} | {r['python_nosync_ms']:.3f} | {r['python_tax_ms']:.3f} | "
              f"{tr:.2f} | <= 1 {ok(tr <= 1)} | {r['buckets_ms']:.3f} | {r['bound']:.2f} | "
              f"<= 1.10 {ok(r['bound'] <= 1.10)} |")
        w("")
        if ddp.get("rerun"):
            w(f"Medium and large 32-true again, best of {ddp['rerun']['reps']}; *spread*: the "
              "largest (slowest run / best run - 1) over the variants:")
            w("")
            w("| model | precision | loom step ms | no-sync ms | tax ms | Python step ms | "
              "no-sync ms | tax ms | loom tax / Python's | buckets alone ms | bound | spread |")
            w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in ddp["rerun"]["rows"]:
                w(f"| {r['size']} | {r['precision']} | {r['loom_ms']:.3f} | "
                  f"{r['loom_nosync_ms']:.3f} | {r['loom_tax_ms']:.3f} | {r['python_ms']:.3f} | "
                  f"{r['python_nosync_ms']:.3f} | {r['python_tax_ms']:.3f} | "
                  f"{r['loom_tax_ms'] / r['python_tax_ms']:.2f} | {r['buckets_ms']:.3f} | "
                  f"{r['bound']:.2f} | {100 * r['spread']:.0f}% |")
            w("")
        extra = [r for r in ddp["rows"] if "loom_k4_ms" in r]
        if extra:
            w("Gradient accumulation (4 micro-batches per step, the first 3 under no_sync) and "
              "the compression hooks (`CommHook::fp16_compress()` / c10d's FP16_COMPRESS, "
              "`bf16_compress()` / `bf16_compress_hook`), ms per step:")
            w("")
            w("| model | precision | loom k=4 | Python k=4 | Python/loom | loom plain | loom "
              "fp16 hook | loom bf16 hook | Python plain | Python fp16 hook | Python bf16 hook |")
            w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in extra:
                w(f"| {r['size']} | {r['precision']} | {r['loom_k4_ms']:.3f} | "
                  f"{r['python_k4_ms']:.3f} | {r['python_k4_ms'] / r['loom_k4_ms']:.2f} | "
                  f"{r['loom_ms']:.3f} | {r['loom_fp16_ms']:.3f} | {r['loom_bf16_ms']:.3f} | "
                  f"{r['python_ms']:.3f} | {r['python_fp16_ms']:.3f} | "
                  f"{r['python_bf16_ms']:.3f} |")
            w("")
        if ddp.get("not_run"):
            w(f"Not run: {ddp['not_run']}.")
            w("")
        if ddp.get("note"):
            w(f"Note: {ddp['note']}.")
            w("")
        if ddp.get("reading"):
            w(f"Reading: {ddp['reading']}")
            w("")
    else:
        w("Not run (`docs/benchmarks/ddp_vs_python.json` is missing).")
        w("")

    # 7. loom::optim against Fabric with its default and with its fused optimizers.
    w("## 7. loom::optim against Fabric's optimizers")
    w("")
    if ovf:
        w(provenance(ovf))
        w("")
        w("`benchmarks/fabric/optim_vs_fabric.py`: the MLPs, weights and batches of part 3; "
          "loom (`loom_fabric_train --optimizer sgd|adam`: `loom::optim::SGD` / `Adam`, one "
          "fused kernel per step) against Fabric with the optimizer's default (on the CPU the "
          "single-tensor loop, what a Fabric user gets) and Fabric with `fused=True` (the best "
          "a Python user can do). SGD(lr=0.01, momentum=0.9) and Adam(lr=1e-3); the three "
          "interleaved, best of the reps. Targets: >= 3x Fabric-default and >= 2x Fabric-fused "
          "on tiny, >= 1.0x on large. Last column: loom's final parameters against "
          "Fabric-fused's.")
        w("")
        w("| threads | model | precision | optimizer | loom steps/s | Fabric default | "
          "loom/default | Fabric fused | loom/fused | target | max abs param diff |")
        w("|---:|---|---|---|---:|---:|---:|---:|---:|---|---:|")
        for r in ovf["rows"]:
            if r["size"] == "tiny":
                met = r["vs_default"] >= 3 and r["vs_fused"] >= 2
                target = f">= 3x / 2x {ok(met)}"
            elif r["size"] == "large":
                target = f">= 1x {ok(r['vs_fused'] >= 1 and r['vs_default'] >= 1)}"
            else:
                target = "-"
            w(f"| {r['threads']} | {r['size']} | {r['precision']} | {r['optimizer']} | "
              f"{r['loom_best']:.1f} | {r['fabric_default_best']:.1f} | {r['vs_default']:.2f} | "
              f"{r['fabric_fused_best']:.1f} | {r['vs_fused']:.2f} | {target} | "
              f"{r['max_abs_param_diff_vs_fused']:.3g} |")
        w("")
        if not any(r["size"] == "large" and r["precision"] == "bf16-mixed" for r in ovf["rows"]):
            w("Large bf16-mixed is not in this run" + (" (see the note)." if ovf.get("note")
                                                       else "."))
            w("")
        if ovf.get("note"):
            w(f"Note: {ovf['note']}.")
            w("")
        prof = os.path.join(a.raw, "optim_profile.md")
        if os.path.exists(prof):
            w("### Where a tiny step's time goes")
            w("")
            w("`benchmarks/fabric/profile_step.py` (torch.profiler on Fabric's step with the "
              "fused optimizer, one thread): the time inside ATen ops and autograd nodes is the "
              "work loom's step does too (part 1: loom executes the instructions of hand-written "
              "LibTorch), so (Fabric's step) / (that time) bounds loom/Fabric-fused from above. "
              "Profiled times run long (the profiler's own cost per op); the ratios between "
              "them are what to read.")
            w("")
            text = open(prof).read().strip()
            w(text)
            w("")
            fig = profile_figures(text)
            f32 = [f for f in fig if f["precision"] == "32-true"]
            bf16 = [f for f in fig if f["precision"] == "bf16-mixed"]
            tiny32 = [r for r in ovf["rows"] if r["size"] == "tiny" and r["precision"] == "32-true"]
            adam_only = (any(r["optimizer"] == "adam" for r in tiny32) and
                         all((r["vs_default"] >= 3) == (r["optimizer"] == "adam") for r in tiny32))
            reading = []
            if f32:
                reading.append(
                    f"in 32-true {span([100 * f['aten_share'] for f in f32], '{:.0f}')}% of "
                    "Fabric's profiled step is ATen work that loom does too, so on tiny models "
                    f"the ratio can only reach about {span([f['ceiling'] for f in f32], '{:.1f}')}x "
                    "against any Python loop of the same ops; Adam's default single-tensor loop "
                    "adds ops that loom's one `_fused_adam_` call does not have" +
                    (", which is why Adam clears 3x against Fabric's default in 32-true and SGD "
                     "(whose default loop is cheap) does not" if adam_only else "") + ".")
            if bf16:
                reading.append(
                    "In bf16-mixed the bf16 GEMMs (`mm`, `addmm`: "
                    f"{span([100 * f['gemm_share'] for f in bf16], '{:.0f}')}% of the ATen time "
                    "here) and autocast's casts (`_to_copy`, `copy_`) are the same work in both, "
                    "and they grow the part loom cannot remove.")
            if reading:
                w("Reading it: " + " ".join(reading) + " What would move the ceiling is fewer "
                  "ATen ops per step than Python's loop (a fused linear+activation backward; "
                  "CUDA graphs on a GPU, not yet run on one), not less loom code: loom's own "
                  "cost is zero (part 1).")
                w("")
    else:
        w("Not run (`docs/benchmarks/optim_vs_fabric.json` is missing).")
        w("")

    # 8. loom against raw PyTorch (no Fabric) and torch.compile.
    w("## 8. loom against raw PyTorch and torch.compile")
    w("")
    if raw_eager:
        w(provenance(raw_eager))
        w("")
        w("`benchmarks/fabric/raw_vs_loom.py`: the MLPs, weights and batches of part 3, against "
          "the strongest Python baselines: raw PyTorch eager with the fused optimizer (no "
          "Fabric) and a `torch.compile`d step (forward + loss + backward compiled, and "
          "`torch.compile(opt.step)`); compile time is the wall time of the compiled side's "
          "warm-up steps. On CUDA (the GPU check, which no GPU has run yet) also loom through "
          "`loom::cuda::GraphedStep` and Python's `torch.cuda.graph` capture. Sides "
          "interleaved, best of the reps; "
          f"torch threads {raw_eager['threads']}, device {raw_eager['device']}. Targets: loom "
          ">= 2.3x eager on tiny, >= 1.0x compiled at every size.")
        w("")
        w("| model | precision | optimizer | loom steps/s | eager | loom/eager | compiled | "
          "loom/compiled | compile s (first rep) | targets | max abs param diff vs eager |")
        w("|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
        for r in raw_eager["rows"]:
            rt = r.get("ratios", {})
            marks = []
            for key in ("loom_vs_eager", "loom_vs_compiled"):
                if key in rt and rt[key]["target"] is not None:
                    marks.append(f">= {rt[key]['target']:g} {ok(rt[key]['met'])}")
            le = rt.get("loom_vs_eager", {}).get("value")
            lc = rt.get("loom_vs_compiled", {}).get("value")
            diff = r.get("max_abs_param_diff_loom_vs_eager")
            w(f"| {r['size']} | {r['precision']} | {r['optimizer']} | "
              f"{r.get('loom_best', 0):.1f} | {r.get('eager_best', 0):.1f} | "
              f"{le if le is None else f'{le:.2f}'} | {r.get('compiled_best', 0):.1f} | "
              f"{lc if lc is None else f'{lc:.2f}'} | {r.get('compile_s_first', 0):.1f} | "
              f"{' / '.join(marks) or '-'} | {diff if diff is None else f'{diff:.3g}'} |")
        w("")
        if raw_eager.get("note"):
            w(f"Note: {raw_eager['note']}")
            w("")
    else:
        w("Not run (`docs/benchmarks/raw_vs_loom.json` is missing).")
        w("")

    # 9. Threads under contention.
    w("## 9. Threads under contention")
    w("")
    if contention:
        w(provenance(contention))
        w("")
        w("`benchmarks/threads/contention.py`: the medium MLP (fused SGD, 32-true), loom "
          "against raw PyTorch, torch threads 1 and 2, on a quiet machine and with busy "
          "processes beside it, with OpenMP's default wait policy and with "
          "`OMP_WAIT_POLICY=PASSIVE`; median steps/s of "
          f"{contention['reps']} interleaved reps ({contention['cores']} cores).")
        w("")
        w("| busy processes | threads | OMP_WAIT_POLICY | loom steps/s | Python steps/s | "
          "loom/Python | loom range | Python range |")
        w("|---:|---:|---|---:|---:|---:|---|---|")
        for r in contention["rows"]:
            lr, pr = r["loom_steps_per_s"], r["python_steps_per_s"]
            w(f"| {r['competitors']} | {r['threads']} | {r['wait_policy']} | "
              f"{r['loom_median']:.1f} | {r['python_median']:.1f} | "
              f"{r['loom_over_python']:.2f} | {min(lr):.0f}-{max(lr):.0f} | "
              f"{min(pr):.0f}-{max(pr):.0f} |")
        w("")
        if contention.get("note"):
            w(contention["note"])
            w("")
    else:
        w("Not run (`docs/benchmarks/contention.json` is missing).")
        w("")

    w("## How to run")
    w("")
    w("```")
    w("scripts/run_benchmarks.sh                      # all parts; Fabric only if lightning is installed")
    w("scripts/run_benchmarks.sh --install-lightning  # opt-in: pip install lightning into loom's venv first")
    w("# the parts, as the script runs them (build tree build-bench):")
    w("cd build-bench/callgrind && valgrind --tool=callgrind --instr-atstart=no \\")
    w("    ../benchmarks/overhead/loom_bench_overhead --mode count --steps 20 --warmup 5 > count.json")
    w("python3 benchmarks/overhead/parse_callgrind.py build-bench/callgrind build-bench/callgrind/count.json docs/benchmarks/overhead_callgrind.json")
    w("build-bench/benchmarks/overhead/loom_bench_overhead --mode wall --rounds 21 --block 40 --warmup 20")
    w("build-bench/benchmarks/overhead/loom_bench_hook_dispatch --benchmark_repetitions=3")
    w("$LOOM_VENV/bin/python benchmarks/fabric/fabric_vs_loom.py --loom-bin build-bench/benchmarks/fabric/loom_fabric_train --out docs/benchmarks/fabric_vs_loom.json --threads 2 --reps 3")
    w("$LOOM_VENV/bin/python benchmarks/fabric/optim_vs_fabric.py --loom-bin build-bench/benchmarks/fabric/loom_fabric_train --out docs/benchmarks/optim_vs_fabric.json --threads 1,2 --reps 3")
    w("$LOOM_VENV/bin/python benchmarks/fabric/profile_step.py > docs/benchmarks/optim_profile.md")
    w("python3 benchmarks/compile_time/measure.py --root . --torch-include $TORCH/include --out docs/benchmarks/compile_time.json --reps 7")
    w("$LOOM_VENV/bin/python benchmarks/ddp/ddp_vs_python.py --bench build-bench/benchmarks/ddp/loom_bench_ddp --out docs/benchmarks/ddp_vs_python.json --reps 3")
    w("$LOOM_VENV/bin/python benchmarks/fabric/raw_vs_loom.py --loom-bin build-bench/benchmarks/fabric/loom_fabric_train --out docs/benchmarks/raw_vs_loom.json --threads 1 --reps 3")
    w("$LOOM_VENV/bin/python benchmarks/threads/contention.py --loom-bin build-bench/benchmarks/fabric/loom_fabric_train --out docs/benchmarks/contention.json --competitors 1 --reps 5")
    w("build-bench/benchmarks/precision/loom_bench_conv_cpu --rounds 5 --seconds 1   # part 5, by hand")
    w("```")
    w("")
    w("On a GPU machine: `scripts/gpu-fabric-check.sh` (Fabric against loom in bf16-mixed and "
      "16-mixed on CUDA; needs lightning installed beforehand). No GPU has run it yet.")
    w("")
    w("![benchmarks](benchmarks/benchmarks.png)")
    open(a.out, "w").write("\n".join(L) + "\n")
    if a.no_plot:
        return

    # The plot.
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(21, 4.5))
    if cg:
        names = [r["precision"] for r in cg["results"]]
        x = range(len(names))
        ax[0].bar([i - 0.2 for i in x], [r["loom_over_hand"] for r in cg["results"]], 0.4,
                  label="loom / hand")
        ax[0].bar([i + 0.2 for i in x], [r["virtual_over_hand"] for r in cg["results"]], 0.4,
                  label="virtual / hand")
        ax[0].axhline(1.005, color="r", ls="--", lw=1, label="target 1.005")
        ax[0].set_ylim(0.99, 1.01)
        ax[0].set_xticks(list(x), names, rotation=30)
        ax[0].set_title("instructions per step (callgrind)")
        ax[0].legend(fontsize=8)
    if fab:
        labels = [f"{r['size']}\n{r['precision']}" for r in fab["results"]]
        x = range(len(labels))
        ax[1].bar([i - 0.2 for i in x], [r["loom_best"] for r in fab["results"]], 0.4, label="loom")
        ax[1].bar([i + 0.2 for i in x], [r["fabric_best"] for r in fab["results"]], 0.4,
                  label="Fabric")
        ax[1].set_yscale("log")
        ax[1].set_xticks(list(x), labels, fontsize=8)
        ax[1].set_ylabel("steps/s (log)")
        ax[1].set_title(f"loom vs Lightning Fabric, CPU, {fab['threads']} threads")
        ax[1].legend(fontsize=8)
    if ct:
        ax[2].bar(["loom", "hand"], [ct["best"]["loom"]["cpu_s"], ct["best"]["hand"]["cpu_s"]])
        ax[2].set_ylabel(f"g++ CPU s, best of {len(ct['runs']['loom'])}")
        ax[2].set_title(f"compile time, {ct['pairs']} pairs: x{ct['ratio_cpu']:.3f}")
    if ddp:
        labels = [f"{r['size']}\n{r['precision']}" for r in ddp["rows"]]
        x = range(len(labels))
        ax[3].bar([i - 0.2 for i in x], [r["loom_tax_ms"] for r in ddp["rows"]], 0.4,
                  label="loom::Ddp")
        ax[3].bar([i + 0.2 for i in x], [r["python_tax_ms"] for r in ddp["rows"]], 0.4,
                  label="Python DDP")
        ax[3].set_yscale("log")
        ax[3].set_xticks(list(x), labels, fontsize=8)
        ax[3].set_ylabel("DDP tax, ms per step (log)")
        ax[3].set_title("DDP, 2 ranks, gloo, CPU, 1 thread each")
        ax[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(a.raw, "benchmarks.png"), dpi=110)


if __name__ == "__main__":
    main()
