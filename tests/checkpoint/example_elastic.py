"""The data-parallel example survives a killed worker: torchrun --max-restarts=1 restarts both
ranks, they resume from the newest checkpoint in --checkpoint-dir, and the run ends with the
final state (DIR/final.pt) of a run that never stopped, tensor for tensor.

  python example_elastic.py --bin build/examples/ddp --data DATA --tmp DIR [--steps 200]

Runs the example uninterrupted, then again (its periodic saves in the background,
--async-save) with one worker SIGKILLed once the checkpoint of a
random one of steps 20, 40, 60 is on disk; compares the two final.pt files with stock torch.load.
The random choices' seed is printed; LOOM_TEST_SEED=<seed> repeats them. Every process has a
deadline and is killed with its session if it outlives it.
"""

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "dist")]
from run_dist import TORCHRUN, base_env, kill  # noqa: E402
from same_state import same, test_seed  # noqa: E402

DEADLINE = 300


def children(pid, binary):
    """The pids of `pid`'s children that run `binary` (torchrun's workers)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for c in kids:
            try:
                if Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")[0] == binary.encode():
                    found.append(c)
            except OSError:
                pass
    return found


def launch(args, log):
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node=2", "--max-restarts=1",
           "--monitor-interval=0.1", "--no-python"] + args
    return subprocess.Popen(cmd, env=base_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(agent, workers, log_path, binary):
    end = time.monotonic() + DEADLINE
    try:
        while agent.poll() is None:
            if time.monotonic() > end:
                raise AssertionError(f"torchrun outlived its {DEADLINE} s deadline")
            workers.update(children(agent.pid, binary))
            time.sleep(0.05)
    finally:
        if agent.returncode != 0:  # a failed or hung run: nothing of it may outlive the test
            kill([agent])
            for w in workers:
                try:
                    os.kill(w, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    text = Path(log_path).read_text(errors="replace")
    if agent.returncode != 0:
        raise AssertionError(f"torchrun exited {agent.returncode}:\n{text[-4000:]}")
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=20)
    a = ap.parse_args()
    tmp = Path(a.tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    common = [a.bin, "--data", a.data, "--max-steps", str(a.steps), "--checkpoint-every",
              str(a.every), "--keep", "2"]

    with open(tmp / "straight.log", "w+b") as log:
        agent = launch(common + ["--checkpoint-dir", str(tmp / "straight")], log)
        finish(agent, set(), tmp / "straight.log", a.bin)

    seed = test_seed("example elastic")
    rng = random.Random(seed)
    at = a.every * rng.randrange(1, 4)  # killed once this step's checkpoint is written
    print(f"example elastic: a worker is SIGKILLed once step-{at}.pt is written (seed {seed})",
          flush=True)
    d = tmp / "killed"
    t0 = time.monotonic()
    with open(tmp / "killed.log", "w+b") as log:
        agent = launch(common + ["--checkpoint-dir", str(d), "--async-save"], log)
        workers = set()
        first = d / f"step-{at}.pt"
        end = time.monotonic() + DEADLINE
        while not first.exists():  # the first checkpoint is on disk: kill a worker now
            if time.monotonic() > end or agent.poll() is not None:
                kill([agent])
                raise AssertionError("no first checkpoint:\n" +
                                     (tmp / "killed.log").read_text(errors="replace")[-4000:])
            workers.update(children(agent.pid, a.bin))
            time.sleep(0.001)
        workers.update(children(agent.pid, a.bin))
        victim = rng.choice(sorted(workers))
        print(f"example elastic: SIGKILL to worker pid {victim} (of {sorted(workers)}) after "
              f"{first.name} (seed {seed})", flush=True)
        os.kill(victim, signal.SIGKILL)
        text = finish(agent, workers, tmp / "killed.log", a.bin)
    if "resumed from" not in text or "(restart 1)" not in text:
        raise AssertionError(f"the restarted ranks did not resume (killed after {first.name}, "
                             f"seed {seed}):\n{text[-4000:]}")
    resumed = text.split("resumed from ", 1)[1].split("\n", 1)[0]
    same(torch.load(tmp / "straight" / "final.pt"), torch.load(d / "final.pt"), "example ddp")
    print(f"example elastic: ok (a worker SIGKILLed once {first.name} was written; torchrun "
          f"restarted both, resumed from {resumed}; final.pt equals the uninterrupted run's, "
          f"tensor for tensor; {time.monotonic() - t0:.1f} s, exit 0)")


if __name__ == "__main__":
    main()
