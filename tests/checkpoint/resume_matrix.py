"""loom's resume tests: a run that stops, is saved and continues in a new process must end with
the same bits as a run that never stopped.

  python resume_matrix.py --bin loom_resume --tmp DIR matrix     every precision x optimizer
  python resume_matrix.py --bin loom_resume --tmp DIR ddp        the same under loom::Ddp, 2 ranks
  python resume_matrix.py --bin loom_resume --tmp DIR sigkill    a save killed midway
  python resume_matrix.py --bin loom_resume --tmp DIR preempt    SIGTERM to one rank of two
  python resume_matrix.py --bin loom_resume --tmp DIR elastic    torchrun restarts after SIGKILL
  python resume_matrix.py --bin loom_resume --tmp DIR orphan     torchrun's agent SIGKILLed
  python resume_matrix.py --bin loom_resume --tmp DIR async      background saves: a write that
                                                                fails, SIGKILL
  python resume_matrix.py --bin loom_resume --tmp DIR full_disk  rank 0 on a full tmpfs (needs
                                                                unshare -rm; else LOOM-SKIPPED)
  python resume_matrix.py --bin loom_resume --tmp DIR resize     Zero stage 2 from 2 ranks to 1, 3
  python resume_matrix.py --bin loom_resume --tmp DIR misuse     a save only rank 0 calls
  python resume_matrix.py --bin loom_resume --tmp DIR seam       a test-only strategy on the
                                                                public seam, under torchrun

For each case loom_resume (tests/checkpoint/resume.cpp) trains STEPS steps straight, and
separately K steps, saves, then in a new process (seeded differently) loads and trains the
rest. Both write their whole final state (model, optimizer, the runtime's RNG and GradScaler
states, the LR scheduler, the sampler, the step); this script opens both with stock
torch.load and compares every tensor bitwise and every other value exactly. Every process has
a deadline; a process that outlives it is killed with its process group. The elastic case's
kill is random: its seed is printed, and LOOM_TEST_SEED=<seed> repeats it. A case that cannot run
here prints "LOOM-SKIPPED: <reason>" and exits 0 (ctest counts it as skipped).
"""

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "dist")]
from run_dist import TORCHRUN, base_env, become_subreaper, free_port, kill, reap  # noqa: E402
from same_state import check, same, test_seed  # noqa: E402

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


def resume_case(bin_, tmp, precision, optimizer, world=1, strategy="ddp"):
    stem = tmp / f"{precision}_{optimizer}_w{world}_{strategy}"
    common = [f"precision={precision}", f"optimizer={optimizer}", f"steps={STEPS}",
              f"strategy={strategy}"]
    run(bin_, common + [f"out={stem}.straight.pt"], world)
    run(bin_, common + [f"save_at={K}", f"save={stem}.k.pt", "kill_after_save=1"], world)
    run(bin_, common + [f"resume={stem}.k.pt", f"out={stem}.resumed.pt"], world)
    straight = torch.load(f"{stem}.straight.pt")
    resumed = torch.load(f"{stem}.resumed.pt")
    same(straight, resumed, f"{precision}/{optimizer}/{world} rank(s)/{strategy}")
    ranks = len(straight["runtime"]["device"])
    check(ranks == world, f"the state holds {ranks} rank(s)' RNG states, want {world}")
    check(straight["step"] == STEPS, f"step {straight['step']!r}, want {STEPS}")
    check(straight["runtime"]["precision"] == precision,
          f"precision {straight['runtime']['precision']!r}, want {precision!r}")
    scaler_state = straight["runtime"]["precision_state"]
    if precision == "16-mixed":  # Python's GradScaler takes the five keys as they are
        scaler = torch.amp.GradScaler("cpu")
        scaler.load_state_dict(scaler_state)
        check(scaler.get_scale() == scaler_state["scale"],
              f"GradScaler scale {scaler.get_scale()!r} != saved {scaler_state['scale']!r}")
        check(scaler.state_dict() == scaler_state,
              f"GradScaler state {scaler.state_dict()!r} != saved {scaler_state!r}")
    else:
        check(scaler_state == {}, f"precision_state {scaler_state!r}, want {{}} for {precision}")
    if world > 1:  # each rank's own RNG stream (seeded seed + rank), both kept
        rng = [d["torch"] for d in straight["runtime"]["device"]]
        check(not torch.equal(rng[0], rng[1]), "the ranks' CPU generators should differ")
    print(f"resume {precision:>10} {optimizer:>10} {world} rank(s) {strategy}: {STEPS} straight == "
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
    # On 3 ranks and more a sum's order depends on an element's place in the reducer's bucket:
    # the resumed run must reduce in the layout the straight run had rebuilt by the save.
    for strategy in ("ddp", "zero1"):
        resume_case(bin_, tmp, "32-true", "adam", world=3, strategy=strategy)
    print(f"checkpoint ddp: ok ({len(DDP_CASES)} cases on 2 ranks, Ddp and Zero stage 1 on 3)")


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
        if not torch.equal(big, torch.full_like(big, big[0].item())):
            raise AssertionError(f"a mixed checkpoint: big holds {big.unique()[:8].tolist()}...")
        check(ck["step"] == K, f"the checkpoint's step {ck['step']!r}, want {K}")
        run(bin_, ["precision=32-true", "optimizer=adam", f"steps={STEPS}", f"resume={path}",
                   "big_mb=48", f"out={tmp / f'kill{attempt}.resumed.pt'}"])
        print(f"sigkill {attempt}: killed {'mid-write' if mid_write else 'between writes'}; "
              f"the file holds version {int(big[0].item())}, whole; it resumes")
        (path.parent / tmp_name).unlink(missing_ok=True)
    if landed == 0:
        raise AssertionError("no kill landed in the middle of a write")
    print(f"checkpoint sigkill: ok ({landed} of 3 kills mid-write)")


class Lines:
    """The output of processes, read line by line as it comes, with a deadline."""

    def __init__(self, procs, deadline):
        self.procs, self.end, self.text = procs, time.monotonic() + deadline, ""
        for p in procs:
            os.set_blocking(p.stdout.fileno(), False)
        self.buffers = [b""] * len(procs)

    def wait_for(self, pattern):
        """Returns the first match of `pattern` in the output so far or to come."""
        start = 0
        while True:
            m = re.compile(pattern, re.M).search(self.text, start)
            if m:
                return m
            if time.monotonic() > self.end:
                raise AssertionError(f"no {pattern!r} before the deadline:\n{self.text[-4000:]}")
            if not self.pump() and all(p.poll() is not None for p in self.procs):
                self.pump()
                m = re.compile(pattern, re.M).search(self.text, start)
                if m:
                    return m
                raise AssertionError(f"no {pattern!r}; the processes exited:\n{self.text[-4000:]}")

    def pump(self):
        got = False
        for i, p in enumerate(self.procs):
            try:
                chunk = p.stdout.read()
            except (BlockingIOError, ValueError):
                chunk = None
            if chunk:
                got = True
                self.buffers[i] += chunk
                *lines, self.buffers[i] = self.buffers[i].split(b"\n")
                for line in lines:
                    self.text += line.decode(errors="replace") + "\n"
        if not got:
            time.sleep(0.01)
        return got

    def finish(self):
        """Waits for every process to exit (killing them at the deadline); their exit codes."""
        try:
            while any(p.poll() is None for p in self.procs):
                if time.monotonic() > self.end:
                    raise AssertionError(f"still running at the deadline:\n{self.text[-4000:]}")
                self.pump()
            while self.pump():
                pass
            for i, b in enumerate(self.buffers):
                if b:
                    self.text += b.decode(errors="replace") + "\n"
                    self.buffers[i] = b""
        finally:
            kill(self.procs)
        return [p.returncode for p in self.procs]


_STRAIGHT = set()  # the straight runs this process made (a file of an earlier build is stale)


def straight_run(bin_, tmp, precision, steps, world=2):
    """The uninterrupted run's final state file (no checkpoint directory), made once per test."""
    out = tmp / f"straight_{precision}_{steps}.pt"
    if out not in _STRAIGHT:
        run(bin_, [f"precision={precision}", "optimizer=adam", f"steps={steps}", f"out={out}"],
            world)
        _STRAIGHT.add(out)
    return out


def hand_ranks(bin_, args, world, port):
    procs = []
    for r in range(world):
        env = base_env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port)
        procs.append(subprocess.Popen([bin_] + args, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def preempt(bin_, tmp):
    """SIGTERM to rank 1 only, mid-epoch: both ranks save the same step and exit 143; a
    relaunch resumes from it and ends with the bits of a run that never stopped."""
    steps = 40
    for precision in ["32-true", "16-mixed"]:
        d = tmp / f"preempt_{precision}"
        shutil.rmtree(d, ignore_errors=True)
        out = tmp / f"preempt_{precision}.pt"
        args = [f"precision={precision}", "optimizer=adam", f"steps={steps}", f"dir={d}",
                "every=10", "step_ms=20", f"out={out}"]
        t0 = time.monotonic()
        procs = hand_ranks(bin_, args, 2, free_port())
        lines = Lines(procs, DEADLINE)
        lines.wait_for(r"^loom_resume: rank 1 step 13$")
        os.kill(procs[1].pid, signal.SIGTERM)
        codes = lines.finish()
        stopped = re.findall(r"rank (\d) stopped by signal 15 after saving step (\d+)", lines.text)
        check(codes == [143, 143], f"exit codes {codes}, want [143, 143]:\n{lines.text[-3000:]}")
        check(len(stopped) == 2 and stopped[0][1] == stopped[1][1],
              f"want both ranks stopped after saving the same step, got {stopped}")
        s = int(stopped[0][1])
        check(13 <= s < steps and (d / f"step-{s}.pt").exists(),
              f"saved step {s}, want 13 <= step < {steps} and its file: {os.listdir(d)}")
        latest = (d / "latest").read_text().strip()
        check(latest == f"step-{s}.pt", f"latest names {latest!r}, want 'step-{s}.pt'")
        t_stop = time.monotonic() - t0
        procs = hand_ranks(bin_, args, 2, free_port())
        lines = Lines(procs, DEADLINE)
        codes = lines.finish()
        check(codes == [0, 0], f"exit codes {codes}, want [0, 0]:\n{lines.text[-3000:]}")
        n = lines.text.count(f"resumed from step {s}")
        check(n == 2, f"{n} rank(s) say 'resumed from step {s}', want 2:\n{lines.text[-3000:]}")
        same(torch.load(straight_run(bin_, tmp, precision, steps)), torch.load(out),
             f"preempt {precision}")
        print(f"preempt {precision}: SIGTERM to rank 1 at step 13; both ranks saved step {s} "
              f"and exited 143 ({t_stop:.1f} s); the relaunch resumed from {s} and ended "
              f"bitwise equal to {steps} steps straight")
    print("checkpoint preempt: ok")


def torchrun_cmd(bin_, args, restarts):
    return [str(TORCHRUN), "--standalone", "--nproc-per-node=2", f"--max-restarts={restarts}",
            "--monitor-interval=0.1", "--no-python", bin_] + args


def elastic(bin_, tmp):
    """torchrun --max-restarts=1: a worker SIGKILLed at a random step; the agent restarts both,
    they resume from the newest checkpoint and finish with the bits of a run that never
    stopped (parameters, optimizer state, GradScaler state, RNG, sampler, scheduler)."""
    steps = 30
    seed = test_seed("elastic")
    rng = random.Random(seed)
    for precision in ["32-true", "16-mixed"]:
        d = tmp / f"elastic_{precision}"
        shutil.rmtree(d, ignore_errors=True)
        out = tmp / f"elastic_{precision}.pt"
        # After the first checkpoint (step 5), so that the restart resumes from one.
        victim, at = rng.randrange(2), rng.randrange(6, steps - 3)
        print(f"elastic {precision}: SIGKILL to rank {victim} at step {at} (seed {seed})",
              flush=True)
        args = [f"precision={precision}", "optimizer=adam", f"steps={steps}", f"dir={d}",
                "every=5", "step_ms=20", f"out={out}"]
        t0 = time.monotonic()
        agent = subprocess.Popen(torchrun_cmd(bin_, args, 1), env=base_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        lines = Lines([agent], DEADLINE)
        pid = int(lines.wait_for(rf"^loom_resume: rank {victim} pid (\d+) attempt 0 ").group(1))
        lines.wait_for(rf"^loom_resume: rank {victim} step {at}$")
        os.kill(pid, signal.SIGKILL)
        try:
            m = lines.wait_for(r"^loom_resume: rank 0 pid \d+ attempt 1 (.*)$")
            codes = lines.finish()
        finally:
            kill_workers(lines.text)
        check(codes == [0], f"torchrun exited {codes}, want [0] (rank {victim} killed at step "
              f"{at}, seed {seed}):\n{lines.text[-4000:]}")
        resumed = m.group(1)
        check(resumed.startswith("resumed from step"),
              f"attempt 1 says {resumed!r}, want 'resumed from step N' (rank {victim} killed at "
              f"step {at}, seed {seed})")
        s = int(resumed.split()[-1])
        check(s % 5 == 0 and s <= at + 1, f"resumed from step {s}, want a multiple of 5 <= "
              f"{at + 1} (killed at step {at}, seed {seed})")
        same(torch.load(straight_run(bin_, tmp, precision, steps)), torch.load(out),
             f"elastic {precision}")
        print(f"elastic {precision}: rank {victim} SIGKILLed at step {at}; torchrun restarted "
              f"both (TORCHELASTIC_RESTART_COUNT=1), they resumed from step {s} and ended bitwise "
              f"equal to {steps} steps straight ({time.monotonic() - t0:.1f} s, exit 0)")
    print("checkpoint elastic: ok")


def kill_workers(text):
    """SIGKILLs the workers a torchrun output names (they run in sessions of their own)."""
    for pid in set(re.findall(r"^loom_resume: rank \d pid (\d+)", text, re.M)):
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def orphan(bin_, tmp):
    """SIGKILL of the torchrun agent: its workers die with it (PR_SET_PDEATHSIG) and write
    nothing more into the checkpoint directory."""
    become_subreaper()
    d = tmp / "orphan"
    shutil.rmtree(d, ignore_errors=True)
    args = ["precision=32-true", "optimizer=adam", "steps=100000", f"dir={d}", "every=2",
            "step_ms=20", f"out={tmp / 'orphan.pt'}"]
    agent = subprocess.Popen(torchrun_cmd(bin_, args, 0), env=base_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    lines = Lines([agent], DEADLINE)
    try:
        pids = [int(lines.wait_for(rf"^loom_resume: rank {r} pid (\d+) ").group(1))
                for r in range(2)]
        lines.wait_for(r"^loom_resume: rank 0 step 7$")
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        t0 = time.monotonic()
        while any(alive(p) for p in pids) and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        gone = time.monotonic() - t0
        left = [p for p in pids if alive(p)]
        before = sorted(os.listdir(d))
        time.sleep(1.0)
        after = sorted(os.listdir(d))
    finally:
        kill_workers(lines.text)
        kill([agent])
        time.sleep(0.1)
        reap()
    check(not left, f"workers {left} outlived torchrun's agent by 10 s")
    check(before == after, f"the directory changed after the agent died: {before} -> {after}")
    print(f"checkpoint orphan: ok (torchrun SIGKILLed at step 7: both workers gone after "
          f"{gone * 1000:.0f} ms, the directory unchanged since: {', '.join(after)})")


def async_saves(bin_, tmp):
    """Asynchronous saves under loom::Ddp (2 ranks, rank 0 writes in the background): the same
    bits as synchronous ones; a write that fails is an error on both ranks; a SIGKILL during
    a background write leaves the checkpoint before it whole. (A full disk: case full_disk.)"""
    steps = 20
    d = tmp / "async_ok"
    shutil.rmtree(d, ignore_errors=True)
    run(bin_, ["precision=16-mixed", "optimizer=adam", f"steps={steps}", f"dir={d}", "every=3",
               "async=1", f"out={tmp / 'async_ok.pt'}"], 2)
    same(torch.load(straight_run(bin_, tmp, "16-mixed", steps)), torch.load(tmp / "async_ok.pt"),
         "async 16-mixed")
    latest = (d / "latest").read_text().strip()
    check(latest == "step-18.pt", f"latest names {latest!r}, want 'step-18.pt': {os.listdir(d)}")
    print(f"async: 2 ranks, 16-mixed, a background save every 3 steps: {steps} steps end "
          "bitwise equal to a run without saves; latest names step-18.pt")

    # A write that fails in the background: step 6's file name is a non-empty directory.
    d = tmp / "async_fail"
    shutil.rmtree(d, ignore_errors=True)
    (d / "step-6.pt" / "occupied").mkdir(parents=True)
    args = ["precision=32-true", "optimizer=adam", f"steps={steps}", f"dir={d}", "every=3",
            "async=1", f"out={tmp / 'async_fail.pt'}"]
    lines = Lines(hand_ranks(bin_, args, 2, free_port()), DEADLINE)
    codes = lines.finish()
    want = f"the background save of {d / 'step-6.pt'} failed on rank 0: "
    n = lines.text.count(want)
    check(codes == [1, 1] and n == 2, f"exit codes {codes} (want [1, 1]), {n} rank(s) say "
          f"{want!r} (want 2):\n{lines.text[-3000:]}")
    latest = (d / "latest").read_text().strip()
    check(latest == "step-3.pt", f"latest names {latest!r}, want 'step-3.pt'")
    print("async: a background write that fails (step 6's name taken by a directory) is a "
          "loom::Error on both ranks at the next save; latest still names step-3.pt")

    # SIGKILL while a background write is under way: the checkpoint before it loads whole.
    landed = 0
    for attempt in range(3):
        d = tmp / f"async_kill{attempt}"
        shutil.rmtree(d, ignore_errors=True)
        args = ["precision=32-true", "optimizer=adam", "steps=100000", f"dir={d}", "every=1",
                "async=1", "big_mb=48", f"out={tmp / 'unused.pt'}"]
        p = subprocess.Popen([bin_] + args, env=base_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            end = time.monotonic() + 60
            while True:  # a write under way after at least one complete checkpoint
                names = os.listdir(d) if d.exists() else []
                if "latest" in names and any(".tmp." in n for n in names):
                    break
                if time.monotonic() > end or p.poll() is not None:
                    raise AssertionError(f"no background write seen: {names}")
                time.sleep(0.0005)
            time.sleep(0.005 * attempt)
            os.killpg(p.pid, signal.SIGKILL)
        finally:
            kill([p])
        names = os.listdir(d)
        landed += any(".tmp." in n for n in names)
        done = sorted(int(n[5:-3]) for n in names if n.startswith("step-") and n.endswith(".pt"))
        check(done, f"no complete checkpoint after the kill: {names}")
        newest = done[-1]
        ck = torch.load(d / f"step-{newest}.pt")
        big = ck["big"]
        check(ck["step"] == newest and torch.equal(big, torch.full_like(big, newest)),
              f"step-{newest}.pt holds step {ck['step']!r} and big {big[:3].tolist()}..., want "
              f"step {newest} and big all {newest}")
        print(f"async kill {attempt}: SIGKILL with {names}; step-{newest}.pt loads whole, its "
              f"big tensor all {newest} (the value at its save, not after)")
    if landed == 0:
        raise AssertionError("no kill landed during a background write")
    print(f"checkpoint async: ok ({landed} of 3 kills during a background write)")


def full_disk(bin_, tmp):
    """A full disk under loom::Ddp: rank 0's checkpoint directory on a 64 KiB tmpfs, mounted in
    a user namespace of its own (unshare -rm). The write fails with 'No space left on device',
    a loom::Error on both ranks, with an asynchronous save and with a synchronous one. Where no
    such namespace and tmpfs can be made it prints LOOM-SKIPPED and exits 0."""
    steps = 20
    d = tmp / "async_full"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    mount = f"mount -t tmpfs -o size=64k tmpfs {d}"
    if shutil.which("unshare") is None:
        print("LOOM-SKIPPED: no unshare command here, so no tmpfs of 64 KiB to fill")
        return
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"{mount} && echo mounted"],
                           capture_output=True, text=True)
    if "mounted" not in probe.stdout:
        reason = probe.stderr.strip().replace("\n", " ") or f"exit {probe.returncode}"
        print(f"LOOM-SKIPPED: cannot mount a tmpfs in a user namespace here ({reason})")
        return
    for mode in ("1", "0"):  # asynchronous, then synchronous: an error, never an abort
        args = ["precision=32-true", "optimizer=adam", f"steps={steps}", f"dir={d}",
                "every=3", f"async={mode}", "big_mb=1", f"out={tmp / 'async_full.pt'}"]
        port = free_port()
        procs = []
        for r in range(2):  # rank 0 inside a namespace of its own, on the small tmpfs
            env = base_env(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=port)
            cmd = [bin_] + args
            if r == 0:
                cmd = ["unshare", "-rm", "sh", "-c", f"{mount} && exec \"$0\" \"$@\""] + cmd
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        lines = Lines(procs, DEADLINE)
        codes = lines.finish()
        check(codes == [1, 1], f"async={mode}: exit codes {codes}, want [1, 1]:\n"
              f"{lines.text[-3000:]}")
        check("No space left on device" in lines.text,
              f"async={mode}: no 'No space left on device' in the output:\n{lines.text[-3000:]}")
        # Both ranks name the writing rank and its reason.
        n = lines.text.count("failed on rank 0: ")
        check(n == 2, f"async={mode}: {n} rank(s) say 'failed on rank 0: ', want 2:\n"
              f"{lines.text[-3000:]}")
        print(f"full_disk async={mode}: rank 0 on a full 64 KiB tmpfs: 'No space left on device', "
              "a loom::Error on both ranks", flush=True)
    print("checkpoint full_disk: ok (rank 0 on a full 64 KiB tmpfs: 'No space left on device', "
          "a loom::Error on both ranks, with an asynchronous save and with a synchronous one)")


def consolidated(path):
    """A checkpoint as one dict: a loom::Zero sharded save's shard files merged into the main
    file's optimizer states, as docs/memory.md shows; a consolidated file as it is."""
    saved = torch.load(path, weights_only=True)
    index = saved.pop("loom_shards", None)
    if index is not None:
        for name in index["files"]:
            for entry, states in torch.load(Path(path).parent / name, weights_only=True).items():
                saved[entry]["state"].update(states)
    return saved


def files_of(d):
    """{name: bytes} of every file in d: a directory left byte for byte as it was."""
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


def resize(bin_, tmp):
    """World sizes change through loom::Checkpoints: a loom::Zero stage 2 run on 2 ranks
    resumes on 1 and on 3 ranks with {.world_size_may_change = true}, its state right after
    the resume equal to the saved one (the optimizer's consolidated, tensor for tensor), and
    trains on; without the option the relaunch is a CheckpointMismatch naming both world sizes
    and the option, and the directory stays byte for byte as it was."""
    for form in ("zero2", "zero2_sharded"):
        d = tmp / f"resize_{form}"
        shutil.rmtree(d, ignore_errors=True)
        base = ["precision=32-true", "optimizer=adam", f"strategy={form}", f"dir={d}", "every=5"]
        run(bin_, base + ["steps=10", f"out={tmp / 'resize_w2.pt'}"], 2)
        saved = consolidated(d / "step-10.pt")
        before = files_of(d)
        lines = Lines(hand_ranks(bin_, base + ["steps=14", f"out={tmp / 'unused.pt'}"], 3,
                                 free_port()), DEADLINE)
        codes = lines.finish()
        want = ("holds the device states of 2 rank(s), this run has 3 (to resume on another "
                "number of ranks: loom::Checkpoints::resume(rt, state, "
                "{.world_size_may_change = true})")
        check(codes == [1, 1, 1] and lines.text.count(want) == 3,
              f"{form}: 3 ranks without the option: exit codes {codes} (want [1, 1, 1]), "
              f"{lines.text.count(want)} rank(s) say {want!r} (want 3):\n{lines.text[-3000:]}")
        check("CheckpointMismatch" in lines.text or "does not fit this run" in lines.text,
              f"{form}: the error does not say the file does not fit:\n{lines.text[-3000:]}")
        check(files_of(d) == before, f"{form}: the refused resume changed {d}")
        for world in (1, 3):
            after = tmp / f"resize_{form}_{world}.resumed.pt"
            out = run(bin_, base + ["steps=14", "resize=1", f"resumed_out={after}",
                                    f"out={tmp / f'resize_{form}_{world}.pt'}"], world)
            check("resumed from step 10" in out[0], f"{form} on {world}: {out[0][-2000:]}")
            got = consolidated(after)
            for entry in ("model", "optimizer", "scheduler", "sampler", "step"):
                same(saved[entry], got[entry], f"{form} 2 -> {world} ranks: {entry}")
            ranks = len(got["runtime"]["device"])
            check(ranks == world, f"{form} on {world}: {ranks} device states")
            # The ranks the saved run had restore its generators; a new rank keeps its own.
            for r in range(min(world, 2)):
                same(saved["runtime"]["device"][r], got["runtime"]["device"][r],
                     f"{form} 2 -> {world} ranks: rank {r}'s generator")
            if world == 3:
                check(not torch.equal(got["runtime"]["device"][2]["torch"],
                                      saved["runtime"]["device"][0]["torch"]),
                      f"{form}: the new rank 2 took rank 0's generator state")
            final = consolidated(tmp / f"resize_{form}_{world}.pt")
            check(final["step"] == 14, f"{form} on {world}: ended at step {final['step']}")
            n = sum(len(s) for s in [got["optimizer"]["state"]])
            print(f"resize {form}: 2 ranks -> {world}: resumed from step 10, model, optimizer "
                  f"({n} parameter states), scheduler, sampler and step equal to the saved "
                  f"ones, the saved ranks' generators restored; trained on to step 14",
                  flush=True)
    print("checkpoint resize: ok (loom::Zero stage 2, consolidated and sharded, saved on 2 "
          "ranks, resumed on 1 and 3; refused without world_size_may_change, the directory "
          "unchanged)")


def misuse(bin_, tmp):
    """`if (rank == 0) ckpt.save(...)`, Python's habit: with TORCH_DISTRIBUTED_DEBUG=DETAIL
    every rank fails within 10 s naming both ranks' collectives (c10d's ProcessGroupWrapper);
    by default rank 0's error says the save is collective (after a short timeout here)."""
    d = tmp / "misuse_detail"
    shutil.rmtree(d, ignore_errors=True)
    args = ["precision=32-true", "optimizer=adam", "steps=20", f"dir={d}", "every=5",
            "rank0_saves=1", "timeout_ms=60000", f"out={tmp / 'unused.pt'}"]
    t0 = time.monotonic()
    procs = []
    port = free_port()
    for r in range(2):
        env = base_env(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port, TORCH_DISTRIBUTED_DEBUG="DETAIL")
        procs.append(subprocess.Popen([bin_] + args, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    lines = Lines(procs, 60)
    codes = lines.finish()
    took = time.monotonic() - t0
    said = lines.text.count("the ranks called different collectives")
    check(codes == [1, 1] and said == 2 and took <= 10 + 5,
          f"DETAIL: exit codes {codes} (want [1, 1]), {said} rank(s) name different collectives "
          f"(want 2), {took:.1f} s (want <= 10 s after start-up):\n{lines.text[-4000:]}")
    check("ALLGATHER" in lines.text.upper() and "ALLREDUCE" in lines.text.upper(),
          f"DETAIL: the error does not name both collectives:\n{lines.text[-4000:]}")
    print(f"misuse DETAIL: rank 0 alone in ckpt.save: both ranks failed in {took:.1f} s, naming "
          "both collectives", flush=True)
    mine = [ln for ln in lines.text.splitlines() if "different collectives" in ln]
    print("  " + mine[0])

    d = tmp / "misuse_default"
    shutil.rmtree(d, ignore_errors=True)
    args = [a.replace("misuse_detail", "misuse_default") for a in args]
    args = [a if not a.startswith("timeout_ms=") else "timeout_ms=4000" for a in args]
    t0 = time.monotonic()
    lines = Lines(hand_ranks(bin_, args, 2, free_port()), 60)
    codes = lines.finish()
    took = time.monotonic() - t0
    want = f"inside loom::save({d / 'step-5.pt'}): every rank must call it"
    check(codes[0] == 1 and want in lines.text,
          f"default: rank 0 exited {codes[0]} (want 1) and says {want!r}: "
          f"{want in lines.text}:\n{lines.text[-4000:]}")
    check(codes[1] != 0, f"default: rank 1 exited {codes[1]}, want an error")
    print(f"misuse default: rank 0 alone in ckpt.save fails after the 4 s timeout ({took:.1f} s "
          "in all) saying 'inside loom::save(...): every rank must call it'; rank 1 fails too",
          flush=True)
    print("checkpoint misuse: ok")


def seam(bin_, tmp):
    """A strategy written on the public seam only (tests/support/gradient_average.hpp:
    GradientAverage, a dist::GroupDefaults over a dist::ProcessGroup that averages every
    gradient after the backward) on 2 ranks: saved by rt.save at step 7 and loaded in new
    processes, it ends bitwise equal to 20 steps straight; under torchrun, loom::Checkpoints
    saves every 5 steps, a second launch resumes from step 10 and ends bitwise equal too. Its
    count of averaged backward passes travels in the runtime entry: the resumed run ends at 20
    only if rt.load restored 7. Its weights are loom::Ddp's, bit for bit (the ranks see
    different batches: without the averaging they would be far apart)."""
    resume_case(bin_, tmp, "32-true", "adam", world=2, strategy="gradient_average")
    straight = torch.load(tmp / "32-true_adam_w2_gradient_average.straight.pt")
    entry = {k: straight["runtime"][k] for k in ("strategy_name", "strategy")}
    check(entry == {"strategy_name": "gradient_average", "strategy": {"averaged": STEPS}},
          f"the runtime entry holds {entry!r}, want GradientAverage's name and "
          f"{{'averaged': {STEPS}}}")
    ddp_out = tmp / "seam_ddp.pt"
    run(bin_, ["precision=32-true", "optimizer=adam", f"steps={STEPS}", "strategy=ddp",
               f"out={ddp_out}"], 2)
    ddp_model = torch.load(ddp_out)["model"]
    # On 2 ranks halving is exact: averaging after the sum (here) or before it (Ddp's reducer)
    # gives the same bits.
    same(ddp_model, straight["model"], "GradientAverage's weights against loom::Ddp's")
    d = tmp / "seam_checkpoints"
    shutil.rmtree(d, ignore_errors=True)
    base = ["precision=32-true", "optimizer=adam", "strategy=gradient_average", f"dir={d}",
            "every=5", f"steps={STEPS}", f"out={tmp / 'seam_final.pt'}"]
    # The first launch leaves after step 10 (its checkpoint written), the second resumes.
    first = ["save_at=10", f"save={tmp / 'seam_unused.pt'}", "kill_after_save=1"]
    text = ""
    for args in (base + first, base):
        agent = subprocess.Popen(torchrun_cmd(bin_, args, 0), env=base_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        lines = Lines([agent], DEADLINE)
        try:
            codes = lines.finish()
        finally:
            kill_workers(lines.text)
        check(codes == [0], f"torchrun {args} exited {codes}:\n{lines.text[-4000:]}")
        text = lines.text
    check("rank 0 pid" in text and "resumed from step 10" in text,
          f"the second launch did not resume from step 10:\n{text[-3000:]}")
    same(straight, torch.load(tmp / "seam_final.pt"), "gradient_average under torchrun")
    print(f"checkpoint seam: ok (GradientAverage, {STEPS} steps straight == {K} + rt.save + rt.load + "
          f"{STEPS - K}, and == 10 + loom::Checkpoints + a torchrun relaunch + {STEPS - 10}, "
          f"bitwise; its weights are loom::Ddp's)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tmp", required=True)
    cases = {"matrix": matrix, "ddp": ddp, "sigkill": sigkill, "preempt": preempt,
             "elastic": elastic, "orphan": orphan, "async": async_saves,
             "full_disk": full_disk, "resize": resize, "misuse": misuse, "seam": seam}
    ap.add_argument("case", choices=sorted(cases))
    a = ap.parse_args()
    tmp = Path(a.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    cases[a.case](a.bin, tmp)


if __name__ == "__main__":
    main()
