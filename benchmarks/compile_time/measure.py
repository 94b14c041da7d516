#!/usr/bin/env python3
"""Compile-time cost of loom: compiles loom_tu.cpp (a training TU: Runtime for every device x
precision pair, fp8-mixed included, and Runtime<Cpu, Fp32, Ddp>, each exercising
setup/to_device/forward/backward/step) and hand_tu.cpp (the same steps by hand, on the torch
headers that loom_tu.cpp's loom headers include) with g++ directly, best of N, and writes JSON.

  measure.py --root REPO --torch-include DIR --out JSON [--reps 3] [--cxx g++] [--opt -O2]

Three figures per TU: wall time and CPU time (user + sys of the compiler), best of N, which
depend on the machine's load; and GCC's -ftime-report total of memory the compiler allocated
("GGC" kB), which does not: the same source and compiler give the same figure on every run, so
the ratio of the two TUs by it is the deterministic measure. -ftime-report's own user time is
recorded beside it. loom's compiled core (CORE_SOURCES below, the non-template code a training TU
would otherwise compile again) is compiled the same way and reported beside the TUs as a cost
paid once per build, not per TU. The Cuda pairs are added to loom_tu.cpp (-DLOOM_WITH_CUDA) when
include/loom/device/cuda.hpp exists and the TU compiles with it.
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

# loom's compiled core: the non-template code of fp8, the GradScaler, the optimizer table and
# gradient clipping, built once into loom::loom (src/ mirrors include/loom/).
CORE_SOURCES = ["src/amp/grad_scaler.cpp", "src/detail/clip_grad.cpp", "src/fp8/fp8.cpp",
                "src/optim/optimizer_table.cpp"]


def timed(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return p.returncode, wall, cpu, p.stderr


def time_report(stderr):
    """-ftime-report's TOTAL line: (user s, sys s, wall s, GGC kB)."""
    m = re.search(r"^ TOTAL\s*:\s*([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9]+)([kMG])",
                  stderr, re.M)
    if not m:
        return None
    unit = {"k": 1, "M": 1024, "G": 1024 * 1024}[m.group(5)]
    return float(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(4)) * unit


def loom_closure(cxx, base, tu, extra):
    """The loom headers tu includes, directly or not (g++ -M)."""
    p = subprocess.run([cxx, "-std=c++20", "-M"] + base + extra + [tu], capture_output=True,
                       text=True)
    if p.returncode != 0:
        sys.exit("compile_time: g++ -M failed:\n" + p.stderr[-3000:])
    deps = p.stdout.replace("\\\n", " ").split()
    return sorted({d for d in deps if os.sep + os.path.join("include", "loom") + os.sep in
                   os.path.abspath(d)})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--torch-include", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cxx", default="g++")
    ap.add_argument("--opt", default="-O2")
    a = ap.parse_args()
    src = os.path.join(a.root, "benchmarks", "compile_time")
    with tempfile.TemporaryDirectory() as gen:
        inc = ["-I", os.path.join(a.root, "include"), "-I", gen,
               "-isystem", a.torch_include,
               "-isystem", os.path.join(a.torch_include, "torch", "csrc", "api", "include")]
        loom_tu = os.path.join(src, "loom_tu.cpp")
        hand_tu = os.path.join(src, "hand_tu.cpp")
        open(os.path.join(gen, "torch_headers.hpp"), "w").write("#pragma once\n")
        devices = ["Cpu"]
        extra = []
        if os.path.exists(os.path.join(a.root, "include", "loom", "device", "cuda.hpp")):
            rc, _, _, err = timed([a.cxx, "-std=c++20", "-fsyntax-only"] + inc +
                                  [loom_tu, "-DLOOM_WITH_CUDA"])
            if rc == 0:
                extra = ["-DLOOM_WITH_CUDA"]
                devices.append("Cuda")
            else:
                print("compile_time: Runtime<Cuda, *> does not compile; Cpu only:\n" + err[-2000:],
                      file=sys.stderr)
        # torch_headers.hpp: every torch header that the loom headers of loom_tu.cpp include,
        # so that hand_tu.cpp parses the same torch code as loom_tu.cpp.
        closure = loom_closure(a.cxx, inc, loom_tu, extra)
        headers = set()
        for h in closure:
            for line in open(h):
                m = re.match(r"\s*#\s*include\s*<((?:torch|ATen|c10|caffe2)/[^>]+)>", line)
                if m:
                    headers.add(m.group(1))
        with open(os.path.join(gen, "torch_headers.hpp"), "w") as f:
            f.write("#pragma once\n" + "".join(f"#include <{h}>\n" for h in sorted(headers)))
        base = [a.cxx, "-std=c++20", a.opt, "-c", "-o", os.devnull] + inc
        loom_cmd = base + [loom_tu] + extra
        hand_cmd = base + [hand_tu]
        pairs = len(devices) * 7 + 1
        runs = {"loom": [], "hand": []}
        for _ in range(a.reps):  # interleaved
            for name, cmd in (("loom", loom_cmd), ("hand", hand_cmd)):
                rc, wall, cpu, err = timed(cmd + ["-ftime-report"])
                if rc != 0:
                    sys.exit(f"compile_time: {name} failed:\n{err[-3000:]}")
                report = time_report(err)
                run = {"wall_s": wall, "cpu_s": cpu}
                if report:
                    run.update({"report_usr_s": report[0], "report_sys_s": report[1],
                                "ggc_kb": report[3]})
                runs[name].append(run)
        # loom's compiled core (CORE_SOURCES): compiled once per build, not per training TU;
        # reported beside the TUs (best of the same reps), never added to the ratio.
        core_srcs = [os.path.join(a.root, f) for f in CORE_SOURCES
                     if os.path.isfile(os.path.join(a.root, f))]
        core = {}
        for src_file in core_srcs:
            best_file = None
            for _ in range(a.reps):
                rc, wall, cpu, err = timed(base + [src_file, "-ftime-report"])
                if rc != 0:
                    sys.exit(f"compile_time: {src_file} failed:\n{err[-3000:]}")
                report = time_report(err)
                run = {"wall_s": wall, "cpu_s": cpu, "ggc_kb": report[3] if report else 0}
                if best_file is None or run["cpu_s"] < best_file["cpu_s"]:
                    best_file = run
            core[os.path.relpath(src_file, a.root)] = best_file
    # The commands as a reader runs them from the repository root: no machine paths.
    root = os.path.abspath(a.root) + os.sep
    torch_inc = os.path.abspath(a.torch_include)

    def relative(cmd):
        return (cmd.replace(torch_inc, "$TORCH/include").replace(gen, "<gen>")
                .replace(root, ""))

    best = {k: {f: min(r[f] for r in v) for f in ("wall_s", "cpu_s", "report_usr_s", "ggc_kb")
                if all(f in r for r in v)}
            for k, v in runs.items()}
    cxx = subprocess.run([a.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    doc = {
        "compiler": cxx, "flags": " ".join(base[1:4]), "devices": devices,
        "pairs": pairs, "torch_headers": len(headers),
        "loom_headers": [os.path.relpath(h, os.path.join(a.root, "include")) for h in closure],
        "loom_cmd": relative(" ".join(loom_cmd)), "hand_cmd": relative(" ".join(hand_cmd)),
        "runs": runs, "best": best,
        "core_once_per_build": core,
        "core_cmd": relative(" ".join(base + ["src/<folder>/<file>.cpp"])),
        "ratio_wall": best["loom"]["wall_s"] / best["hand"]["wall_s"],
        "ratio_cpu": best["loom"]["cpu_s"] / best["hand"]["cpu_s"],
    }
    if "ggc_kb" in best["loom"] and "ggc_kb" in best["hand"]:
        doc["ratio_ggc"] = best["loom"]["ggc_kb"] / best["hand"]["ggc_kb"]
        doc["ratio_report_usr"] = best["loom"]["report_usr_s"] / best["hand"]["report_usr_s"]
    json.dump(doc, open(a.out, "w"), indent=1)
    print(f"compile time, best of {a.reps}: loom {best['loom']['cpu_s']:.1f} s CPU "
          f"({best['loom']['wall_s']:.1f} s wall), hand {best['hand']['cpu_s']:.1f} s CPU "
          f"({best['hand']['wall_s']:.1f} s wall): x{doc['ratio_cpu']:.3f} CPU, "
          f"x{doc['ratio_wall']:.3f} wall; GGC {best['loom'].get('ggc_kb', 0)} kB vs "
          f"{best['hand'].get('ggc_kb', 0)} kB: x{doc.get('ratio_ggc', 0):.3f} "
          f"({pairs} runtimes, {len(closure)} loom headers, {len(headers)} torch headers)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
