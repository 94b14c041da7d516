"""examples/08_char_lm --profile: the trace it writes, opened as JSON.

Runs char_lm for 12 steps with --profile DIR (steps 7-9 recorded), then reads
DIR/rank-0.step-9.pt.trace.json: the three steps' ProfilerStep#N scopes are there and no
other, each holds the step's operators (the attention's and the MLP's products, the
cross-entropy, the backward's nodes, fused AdamW once a param group), and the table printed has Python's
columns.

Usage: python example_trace.py --bin CHAR_LM --text DIR --dir OUT
"""

import argparse
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    r = subprocess.run([a.bin, "--text", a.text, "--steps", "12", "--warmup-steps", "2",
                        "--sample", "0", "--profile", str(d)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"char_lm profile: the example failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    traces = sorted(p.name for p in d.glob("*.pt.trace.json"))
    if traces != ["rank-0.step-9.pt.trace.json"]:
        raise SystemExit(f"char_lm profile: wrote {traces}")
    if not all(h in r.stdout for h in ("Self CPU %", "CPU total", "# of Calls")):
        raise SystemExit(f"char_lm profile: no table in {r.stdout[-2000:]}")
    events = json.loads((d / traces[0]).read_text())["traceEvents"]
    steps = {}
    for e in events:
        m = re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))
        if m and e.get("ph") == "X":
            steps[int(m[1])] = (e["ts"], e["ts"] + e["dur"], Counter())
    if sorted(steps) != [7, 8, 9]:
        raise SystemExit(f"char_lm profile: the trace holds steps {sorted(steps)}")
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "cpu_op":
            continue
        for first, last, ops in steps.values():
            if first <= e["ts"] <= last:
                ops[e["name"]] += 1
    for n, (_, _, ops) in sorted(steps.items()):
        need = {"aten::_fused_adamw_": 2}  # one a param group: with and without decay
        wrong = {k: ops[k] for k, v in need.items() if ops[k] != v}
        missing = [k for k in ("aten::matmul", "aten::cross_entropy_loss", "aten::embedding")
                   if ops[k] == 0]
        if wrong or missing or not any(k.startswith("autograd::engine") for k in ops):
            raise SystemExit(f"char_lm profile: step {n}: {wrong} {missing} in {dict(ops)}")
        print(f"char_lm profile: step {n}: {sum(ops.values())} operators (aten::matmul x"
              f"{ops['aten::matmul']}, aten::_fused_adamw_ x2, "
              f"{sum(v for k, v in ops.items() if k.startswith('autograd::engine'))} backward nodes)")
    print("char_lm profile: ok")


if __name__ == "__main__":
    main()
