"""loom::Published against the Python pattern, side by side (docs/embedding.md).

Runs loom_bench_published and python_queue.py with the same settings, one after the other on
the same machine, and prints each figure of both with their ratio.

  python compare.py --bench build/benchmarks/loom_bench_published [--seconds S] [--rounds R]
                    [--width W]
"""

import argparse
import subprocess
import sys
from pathlib import Path


def figures(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    return {k: float(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", required=True)
    parser.add_argument("--seconds", default="3")
    parser.add_argument("--rounds", default="3")
    parser.add_argument("--width", default="1024")
    args = parser.parse_args()
    common = ["--seconds", args.seconds, "--rounds", args.rounds, "--width", args.width]
    loom = figures([args.bench] + common)
    python = figures([sys.executable, str(Path(__file__).with_name("python_queue.py"))] + common)
    print(f"{'figure':26} {'loom':>12} {'python':>12} {'loom/python':>12}")
    for key in loom:
        p = python.get(key)
        ratio = f"{loom[key] / p:12.3f}" if p else f"{'':12}"
        print(f"{key:26} {loom[key]:12.2f} {p if p is not None else float('nan'):12.2f} {ratio}")


if __name__ == "__main__":
    main()
