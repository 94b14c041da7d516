"""loom's resume tests: a run that stops, is saved and continues in a new process must end with
the same bits as a run that never stopped.

  python resume_matrix.py --bin loom_resume --tmp DIR matrix     every precision x optimizer
  python resume_matrix.py --bin loom_resume --tmp DIR ddp        the same under loom::Ddp, 2 ranks
  python resume_matrix.py --bin loom_resume --tmp DIR sigkill    a save killed midway

For each case loom_resume (tests/checkpoint/resume.cpp) trains STEPS steps straight, and
separately K steps, saves, then in a new process (seeded differently) loads and trains the
rest. Both write their whole final state (model, optimizer, the runtime's RNG and GradScaler
states, the LR scheduler, the sampler, the step); this script opens both with stock
torch.load and compares every tensor bitwise and every other value exactly. Every process has
a deadline; a process that outlives it is killed with its process group.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "dist")]
from run_dist import base_env, free_port, kill  # noqa: E402
from same_state import same  # noqa: E402

STEPS, K = 20, 7
PRECISIONS = ["32-true", "64-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"]
OPTIMIZERS = ["sgd", "adam", "torch_sgd", "torch_adam"]
DDP_CASES = [("32-true", "adam"), ("16-mixed", "sgd"), ("bf16-mixed", "torch_adam")]
DEADLINE = 240


def run(bin_, args, world=1, env_extra=None):
    """Runs loom_resume on `world` ranks (by hand, torchrun's variables) and waits for all."""
    port = free_port()
    procs = []
    for r in range(world):
        extra = dict(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=port) if world > 1 else {}
        extra.update(env_extra or {})
        procs.append(subprocess.Popen([bin_] + args, env=base_env(**extra), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    outputs = []
    try:
        end = time.monotonic() + DEADLINE
        for p in procs:
            out, _ = p.communicate(timeout=max(1, end - time.monotonic()))
            outputs.append(out.decode(errors="replace"))
    except subprocess.TimeoutExpired:
        kill(procs)
        raise AssertionError(f"{args}: a rank outlived its {DEADLINE} s deadline")
    finally:
        kill(procs)
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            raise AssertionError(f"{args} exited {p.returncode}:\n{out}")
    return outputs


def resume_case(bin_, tmp, precision, optimizer, world=1):
    stem = tmp / f"{precision}_{optimizer}_w{world}"
    common = [f"precision={precision}", f"optimizer={optimizer}", f"steps={STEPS}"]
    run(bin_, common + [f"out={stem}.straight.pt"], world)
    run(bin_, common + [f"save_at={K}", f"save={stem}.k.pt", "kill_after_save=1"], world)
    run(bin_, common + [f"resume={stem}.k.pt", f"out={stem}.resumed.pt"], world)
    straight = torch.load(f"{stem}.straight.pt")
    resumed = torch.load(f"{stem}.resumed.pt")
    same(straight, resumed, f"{precision}/{optimizer}/{world} rank(s)")
    ranks = len(straight["runtime"]["device"])
    assert ranks == world, ranks
    assert straight["step"] == STEPS and straight["runtime"]["precision"] == precision
    scaler_state = straight["runtime"]["precision_state"]
    if precision == "16-mixed":  # Python's GradScaler takes the five keys as they are
        scaler = torch.amp.GradScaler("cpu")
        scaler.load_state_dict(scaler_state)
        assert scaler.get_scale() == scaler_state["scale"], scaler_state
        assert scaler.state_dict() == scaler_state, (scaler.state_dict(), scaler_state)
    else:
        assert scaler_state == {}, scaler_state
    if world > 1:  # each rank's own RNG stream (seeded seed + rank), both kept
        rng = [d["torch"] for d in straight["runtime"]["device"]]
        assert not torch.equal(rng[0], rng[1]), "the ranks' CPU generators should differ"
    print(f"resume {precision:>10} {optimizer:>10} {world} rank(s): {STEPS} straight == "
          f"{K} + save + load in a new process + {STEPS - K}, bitwise "
          f"(sampler epoch {straight['sampler']['epoch']}, scaler "
          f"{'yes' if straight['runtime']['precision_state'] else 'none'})")


def matrix(bin_, tmp):
    for precision in PRECISIONS:
        for optimizer in OPTIMIZERS:
            resume_case(bin_, tmp, precision, optimizer)
    print(f"checkpoint matrix: ok ({len(PRECISIONS) * len(OPTIMIZERS)} cases)")


def ddp(bin_, tmp):
    for precision, optimizer in DDP_CASES:
        resume_case(bin_, tmp, precision, optimizer, world=2)
    print(f"checkpoint ddp: ok ({len(DDP_CASES)} cases, 2 ranks)")


def sigkill(bin_, tmp):
    """Kills a process while it writes a checkpoint over a good one: the good one must load."""
    landed = 0
    for attempt in range(3):
        path = tmp / f"kill{attempt}.pt"
        args = ["precision=32-true", "optimizer=adam", f"steps={STEPS}", f"save_at={K}",
                f"save={path}", "big_mb=48"]
        p = subprocess.Popen([bin_] + args, env=base_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            seen = ""
            while "saved once" not in seen:
                line = p.stdout.readline().decode()
                if not line:
                    raise AssertionError(f"loom_resume did not save:\n{seen}")
                seen += line
            tmp_name = f".{path.name}.tmp.{p.pid}"
            end = time.monotonic() + 60
            while not (path.parent / tmp_name).exists():  # a save is under way
                if time.monotonic() > end:
                    raise AssertionError("no save under way within 60 s")
                time.sleep(0.0005)
            time.sleep(0.01 * attempt)
            os.killpg(p.pid, signal.SIGKILL)
        finally:
            kill([p])
        mid_write = (path.parent / tmp_name).exists()
        landed += mid_write
        ck = torch.load(path)  # the last complete checkpoint, whole
        big = ck["big"]
        assert torch.equal(big, torch.full_like(big, big[0].item())), "a mixed checkpoint"
        assert ck["step"] == K
        run(bin_, ["precision=32-true", "optimizer=adam", f"steps={STEPS}", f"resume={path}",
                   "big_mb=48", f"out={tmp / f'kill{attempt}.resumed.pt'}"])
        print(f"sigkill {attempt}: killed {'mid-write' if mid_write else 'between writes'}; "
              f"the file holds version {int(big[0].item())}, whole; it resumes")
        (path.parent / tmp_name).unlink(missing_ok=True)
    if landed == 0:
        raise AssertionError("no kill landed in the middle of a write")
    print(f"checkpoint sigkill: ok ({landed} of 3 kills mid-write)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("case", choices=["matrix", "ddp", "sigkill"])
    a = ap.parse_args()
    tmp = Path(a.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    {"matrix": matrix, "ddp": ddp, "sigkill": sigkill}[a.case](a.bin, tmp)


if __name__ == "__main__":
    main()
