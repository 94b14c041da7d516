#!/usr/bin/env python3
"""Plots a training metrics CSV (as `quickstart --metrics FILE` writes it) to a PNG.

    python scripts/plot_metrics.py metrics.csv metrics.png [--check]

The CSV has the header step,loss,lr,samples_per_s and one row per logged step. The PNG has
two panels sharing the step axis: the loss (log scale when it spans more than a decade), and
the throughput in samples/s. --check also verifies the CSV (steps rising, finite positive
losses) and the written PNG, and exits non-zero if either is wrong.

Needs matplotlib in the Python that runs it (python -m pip install matplotlib).
"""
import argparse
import csv
import math
import os
import sys

HEADER = ["step", "loss", "lr", "samples_per_s"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_metrics(path):
    """The CSV's columns as lists of numbers; raises ValueError on a malformed file."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != HEADER:
            raise ValueError(f"{path}: header is {header}, expected {','.join(HEADER)}")
        columns = {name: [] for name in HEADER}
        for line, row in enumerate(reader, start=2):
            if len(row) != len(HEADER):
                raise ValueError(f"{path}:{line}: {len(row)} fields, expected {len(HEADER)}")
            try:
                values = [int(row[0])] + [float(v) for v in row[1:]]
            except ValueError:
                raise ValueError(f"{path}:{line}: not numbers: {','.join(row)}") from None
            for name, value in zip(HEADER, values):
                columns[name].append(value)
    if not columns["step"]:
        raise ValueError(f"{path}: no rows")
    return columns


def check_metrics(path, m):
    """Raises ValueError unless steps rise and every loss is finite and positive."""
    steps = m["step"]
    for before, after in zip(steps, steps[1:]):
        if after <= before:
            raise ValueError(f"{path}: step {after} follows step {before}")
    for step, loss in zip(steps, m["loss"]):
        if not math.isfinite(loss) or loss <= 0:
            raise ValueError(f"{path}: loss {loss} at step {step}")


def plot(m, out):
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_metrics.py: matplotlib is missing; install it into this Python with\n"
                 f"  {sys.executable} -m pip install matplotlib")
    matplotlib.use("Agg")  # no display needed: write the file only
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_rate) = plt.subplots(2, 1, sharex=True, figsize=(7, 5),
                                           gridspec_kw={"height_ratios": [2, 1]})
    ax_loss.plot(m["step"], m["loss"], marker="." if len(m["step"]) < 50 else None)
    losses = [v for v in m["loss"] if v > 0]
    if losses and max(losses) / min(losses) > 10:
        ax_loss.set_yscale("log")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(True, alpha=0.3)
    ax_rate.plot(m["step"], m["samples_per_s"], color="tab:green")
    ax_rate.set_ylabel("samples/s")
    ax_rate.set_xlabel("step")
    ax_rate.set_ylim(bottom=0)
    ax_rate.grid(True, alpha=0.3)
    fig.suptitle(f"training: {len(m['step'])} logged steps, last loss {m['loss'][-1]:.4g}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description="Plot a loom metrics CSV to a PNG.")
    parser.add_argument("csv", help="the metrics CSV (step,loss,lr,samples_per_s)")
    parser.add_argument("png", help="the PNG to write")
    parser.add_argument("--check", action="store_true",
                        help="verify the CSV and the written PNG; exit 1 if either is wrong")
    args = parser.parse_args()
    try:
        m = read_metrics(args.csv)
        if args.check:
            check_metrics(args.csv, m)
    except (OSError, ValueError) as e:
        sys.exit(f"plot_metrics.py: {e}")
    plot(m, args.png)
    if args.check:
        with open(args.png, "rb") as f:
            if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
                sys.exit(f"plot_metrics.py: {args.png} is not a PNG")
    print(f"wrote {args.png}: {len(m['step'])} rows, steps {m['step'][0]} to {m['step'][-1]}, "
          f"loss {m['loss'][0]:.4g} -> {m['loss'][-1]:.4g} ({os.path.getsize(args.png)} bytes)")


if __name__ == "__main__":
    main()
