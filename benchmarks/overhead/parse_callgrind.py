#!/usr/bin/env python3
"""Reads the parts that `loom_bench_overhead --mode count` dumped under callgrind
(callgrind.out.<pid>.<n>, one per "<precision>/<impl>") and writes their instruction counts,
the ratios to the hand-written step and, as evidence, the functions whose own (exclusive)
instruction count differs most between loom and hand.

  parse_callgrind.py DIR COUNT_JSON OUT_JSON
"""
import glob
import json
import re
import subprocess
import sys


def parts(d):
    out = {}
    for f in glob.glob(f"{d}/callgrind.out.*.*"):
        name = total = None
        with open(f, "rb") as fh:
            for raw in fh:
                line = raw.decode("utf-8", "replace")
                if line.startswith("desc: Trigger: Client Request: "):
                    name = line.split(": ", 3)[-1].strip()
                elif line.startswith("summary:") or (total is None and line.startswith("totals:")):
                    total = int(line.split()[1])
        if name and "/" in name and total is not None:
            out[name] = (total, f)
    return out


def exclusive(f):
    """function -> exclusive Ir, from callgrind_annotate."""
    txt = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", f],
                         capture_output=True, text=True).stdout
    costs = {}
    for line in txt.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([\s\d.]+%\)\s+(.*)$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        fn = m.group(2)
        fn = re.sub(r"\s\([\d,]+x\)$", "", fn)     # the call count
        fn = re.sub(r"\s\[[^\]]*\]$", "", fn)   # the object file
        fn = re.sub(r"\s\([\d,]+x\)$", "", fn)
        fn = fn.split(":", 1)[1] if ":" in fn.split("(")[0] else fn  # the source file
        costs[fn] = costs.get(fn, 0) + int(m.group(1).replace(",", ""))
    return costs


def main():
    d, count_json, out_json = sys.argv[1:4]
    meta = json.load(open(count_json))
    steps = {r["precision"]: r["steps"] for r in meta["results"]}
    diffs = {r["precision"]: r for r in meta["results"]}
    p = parts(d)
    rows = []
    for prec in steps:
        h, l, v = (p.get(f"{prec}/{i}") for i in ("hand", "loom", "virtual"))
        if not (h and l and v):
            continue
        n = steps[prec]
        row = {
            "precision": prec, "steps": n,
            "hand_ir_per_step": h[0] / n, "loom_ir_per_step": l[0] / n,
            "virtual_ir_per_step": v[0] / n,
            "loom_over_hand": l[0] / h[0], "virtual_over_hand": v[0] / h[0],
            "loom_minus_hand_ir_per_step": (l[0] - h[0]) / n,
            "virtual_minus_hand_ir_per_step": (v[0] - h[0]) / n,
            "max_abs_diff_loom_hand": diffs[prec]["max_abs_diff_loom_hand"],
            "max_abs_diff_virtual_hand": diffs[prec]["max_abs_diff_virtual_hand"],
        }
        eh, el = exclusive(h[1]), exclusive(l[1])
        # The benchmark's own frames (main, the trainers, hand_*) are named differently on the
        # two sides and carry the costs callgrind leaves on frames live at a dump; skip them.
        own = ("(anonymous namespace)::run_steps", "(anonymous namespace)::hand_", "Trainer<",
               "with_precision", "events annotated")
        keys = [k for k in set(eh) | set(el)
                if not k.startswith("main") and not any(o in k for o in own)]
        delta = {k: (el.get(k, 0) - eh.get(k, 0)) / n for k in keys}
        top = sorted(delta.items(), key=lambda kv: -abs(kv[1]))[:6]
        row["largest_exclusive_deltas_per_step"] = [{"function": k[:160], "loom_minus_hand": x}
                                                    for k, x in top]
        rows.append(row)
        print(f"{prec:10s} Ir/step hand {row['hand_ir_per_step']:10.0f} loom "
              f"{row['loom_ir_per_step']:10.0f} virtual {row['virtual_ir_per_step']:10.0f}  "
              f"loom/hand {row['loom_over_hand']:.5f}  virtual/hand {row['virtual_over_hand']:.5f}",
              file=sys.stderr)
    json.dump({"model": meta["model"], "threads": meta["threads"], "results": rows},
              open(out_json, "w"), indent=1)


if __name__ == "__main__":
    main()
