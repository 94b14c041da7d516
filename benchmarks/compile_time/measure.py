#!/usr/bin/env python3
"""Compile-time cost of loom: compiles loom_tu.cpp (Runtime for every device x precision pair,
each exercising setup/to_device/forward/backward/step) and hand_tu.cpp (the same steps by hand,
on the torch headers loom includes) with g++ directly, best of N, and writes JSON.

  measure.py --root REPO --torch-include DIR --out JSON [--reps 3] [--cxx g++] [--opt -O2]

Both wall time and CPU time (user + sys of the compiler) are recorded: on a loaded machine the
CPU time is the stable figure. Cuda x 6 is added to loom_tu.cpp (-DLOOM_WITH_CUDA) when
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


def timed(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return p.returncode, wall, cpu, p.stderr


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
        # torch_headers.hpp: every torch header include/loom includes, so that hand_tu.cpp
        # parses the same torch code as loom_tu.cpp.
        headers = set()
        for d, _, files in os.walk(os.path.join(a.root, "include", "loom")):
            for f in files:
                for line in open(os.path.join(d, f)):
                    m = re.match(r"\s*#\s*include\s*<((?:torch|ATen|c10|caffe2)/[^>]+)>", line)
                    if m:
                        headers.add(m.group(1))
        with open(os.path.join(gen, "torch_headers.hpp"), "w") as f:
            f.write("#pragma once\n" + "".join(f"#include <{h}>\n" for h in sorted(headers)))
        base = [a.cxx, "-std=c++20", a.opt, "-c", "-o", os.devnull,
                "-I", os.path.join(a.root, "include"), "-I", gen,
                "-isystem", a.torch_include,
                "-isystem", os.path.join(a.torch_include, "torch", "csrc", "api", "include")]
        loom_cmd = base + [os.path.join(src, "loom_tu.cpp")]
        hand_cmd = base + [os.path.join(src, "hand_tu.cpp")]
        devices = ["Cpu"]
        if os.path.exists(os.path.join(a.root, "include", "loom", "device", "cuda.hpp")):
            rc, _, _, err = timed(loom_cmd + ["-DLOOM_WITH_CUDA"])
            if rc == 0:
                loom_cmd.append("-DLOOM_WITH_CUDA")
                devices.append("Cuda")
            else:
                print("compile_time: Runtime<Cuda, *> does not compile; Cpu only:\n" + err[-2000:],
                      file=sys.stderr)
        runs = {"loom": [], "hand": []}
        for _ in range(a.reps):  # interleaved
            for name, cmd in (("loom", loom_cmd), ("hand", hand_cmd)):
                rc, wall, cpu, err = timed(cmd)
                if rc != 0:
                    sys.exit(f"compile_time: {name} failed:\n{err[-3000:]}")
                runs[name].append({"wall_s": wall, "cpu_s": cpu})
    # The commands as a reader runs them from the repository root: no machine paths.
    root = os.path.abspath(a.root) + os.sep
    torch_inc = os.path.abspath(a.torch_include)

    def relative(cmd):
        return (cmd.replace(torch_inc, "$TORCH/include").replace(gen, "<gen>")
                .replace(root, ""))

    best = {k: {"wall_s": min(r["wall_s"] for r in v), "cpu_s": min(r["cpu_s"] for r in v)}
            for k, v in runs.items()}
    cxx = subprocess.run([a.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    doc = {
        "compiler": cxx, "flags": " ".join(base[1:4]), "devices": devices,
        "pairs": len(devices) * 6, "torch_headers": len(headers),
        "loom_cmd": relative(" ".join(loom_cmd)), "hand_cmd": relative(" ".join(hand_cmd)),
        "runs": runs, "best": best,
        "ratio_wall": best["loom"]["wall_s"] / best["hand"]["wall_s"],
        "ratio_cpu": best["loom"]["cpu_s"] / best["hand"]["cpu_s"],
    }
    json.dump(doc, open(a.out, "w"), indent=1)
    print(f"compile time, best of {a.reps}: loom {best['loom']['cpu_s']:.1f} s CPU "
          f"({best['loom']['wall_s']:.1f} s wall), hand {best['hand']['cpu_s']:.1f} s CPU "
          f"({best['hand']['wall_s']:.1f} s wall): x{doc['ratio_cpu']:.3f} CPU, "
          f"x{doc['ratio_wall']:.3f} wall ({len(devices) * 6} pairs)", file=sys.stderr)


if __name__ == "__main__":
    main()
