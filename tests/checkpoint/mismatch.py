"""A checkpoint directory that does not fit the run is an error that changes nothing: the
examples exit non-zero naming what differs, and every file of the directory is left byte for
byte as it was (no fallback to an older checkpoint that happens to fit, no save, no pruning).

  python mismatch.py --bin-dir build/examples --data DATA --tmp DIR CASE

CASE:
  precision   quickstart: a 16-mixed run's file left (as step-10.pt) in a bf16-mixed run's
              directory (steps 20, 40, 60, final), then a 16-mixed run on that directory
  shapes      char_lm: a --width 32 run's directory, then a --width 48 run on it
  world_size  ddp: a 2-rank torchrun run's directory, then a 1-rank run on it
Each prints "checkpoint mismatch CASE: ok" when the last run exits non-zero with the message
and the directory is unchanged. Every process has a deadline.
"""

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "dist")]
from run_dist import TORCHRUN, base_env  # noqa: E402

DEADLINE = 300


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def run(cmd, writes=None):
    """Runs cmd; returns (exit status, output). With `writes`, the run sets up a directory: it
    must have written that file (a short quickstart run exits 1, "did NOT learn", after its
    checkpoints are saved: that status is its verdict on the accuracy, not a failure here)."""
    print("$", " ".join(str(c) for c in cmd), flush=True)
    p = subprocess.run([str(c) for c in cmd], env=base_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, errors="replace", timeout=DEADLINE)
    if writes is not None:
        check(p.returncode in (0, 1) and Path(writes).is_file(),
              f"exit status {p.returncode}, {writes} written: {Path(writes).is_file()}:\n"
              f"{p.stdout[-4000:]}")
    return p.returncode, p.stdout


def snapshot(directory):
    """{name: sha256} of every file in the directory."""
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(Path(directory).iterdir())}


def refused(cmd, directory, wants):
    """Runs cmd on `directory` and checks that it fails, says each of `wants`, and leaves every
    file of the directory as it was."""
    before = snapshot(directory)
    status, text = run(cmd)
    print(text[-3000:])
    check(status != 0, f"the run on a directory that does not fit exited 0:\n{text[-4000:]}")
    check(status > 0, f"the run crashed (status {status}) instead of refusing")
    for want in wants:
        check(want in text, f"the refusal does not say {want!r}:\n{text[-4000:]}")
    after = snapshot(directory)
    check(after == before, f"the directory changed:\n  before {before}\n  after  {after}")
    print(f"{len(before)} files unchanged: {', '.join(sorted(before))}")


def case_precision(a, tmp):
    qs = Path(a.bin_dir) / "quickstart"
    old, runs = tmp / "old", tmp / "run"
    common = [qs, "--data", a.data, "--checkpoint-every", "20"]
    run(common + ["--precision", "16-mixed", "--max-steps", "20", "--checkpoint-dir", old],
        writes=old / "step-20.pt")
    run(common + ["--precision", "bf16-mixed", "--max-steps", "60", "--keep", "5",
                  "--checkpoint-dir", runs], writes=runs / "step-60.pt")
    shutil.copyfile(old / "step-20.pt", runs / "step-10.pt")  # an older run's file left there
    refused(common + ["--precision", "16-mixed", "--max-steps", "100", "--keep", "5",
                      "--checkpoint-dir", runs],
            runs, ["step-60.pt does not fit this run", 'precision "bf16-mixed"', '"16-mixed"',
                   "nothing in", "was changed"])


def case_shapes(a, tmp):
    lm = Path(a.bin_dir) / "char_lm"
    runs = tmp / "run"
    common = [lm, "--text", a.text, "--steps", "20", "--warmup-steps", "5", "--sample", "0",
              "--checkpoint-every", "10", "--checkpoint-dir", runs]
    run(common + ["--width", "32", "--heads", "2"], writes=runs / "step-20.pt")
    refused(common + ["--width", "48", "--heads", "2"], runs,
            ["step-20.pt does not fit this run", "has shape", "nothing in", "was changed"])


def case_world_size(a, tmp):
    ddp = Path(a.bin_dir) / "ddp"
    runs = tmp / "run"
    common = [ddp, "--data", a.data, "--max-steps", "20", "--checkpoint-every", "10",
              "--checkpoint-dir", runs]
    launch = [TORCHRUN, "--standalone", "--no-python"]
    run(launch + ["--nproc-per-node=2"] + common, writes=runs / "step-20.pt")
    refused(launch + ["--nproc-per-node=1"] + common, runs,
            ["step-20.pt does not fit this run", "2 rank(s), this run has 1", "nothing in",
             "was changed"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--text", default="/usr/share/common-licenses")
    ap.add_argument("--tmp", required=True)
    ap.add_argument("case", choices=["precision", "shapes", "world_size"])
    a = ap.parse_args()
    tmp = Path(a.tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    globals()["case_" + a.case](a, tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"checkpoint mismatch {a.case}: ok")


if __name__ == "__main__":
    main()
