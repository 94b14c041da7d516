"""Runs one of loom's multi-process tests: starts the ranks of tests/dist/worker.cpp (by hand
with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or through torchrun), on free ports, with a
deadline; kills whatever is left; checks each rank's exit code and output.

Usage: python run_dist.py --worker BIN CASE
Every case prints "dist <case>: ok ..." on success and exits 0; otherwise it prints what
differed, every rank's output, and exits 1.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TORCHRUN = Path(sys.executable).with_name("torchrun")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Failure(Exception):
    pass


def start(cmd, env, log):
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()


def base_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE")}
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def become_subreaper():
    """Orphans of this process's descendants (a killed agent's workers) come to it, not to an
    init that may not reap them, so that the test can reap them (reap())."""
    import ctypes
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def run_ranks(worker, mode, world, deadline, tmp, ranks=None, env_extra=None, first_exit=None,
              **kv):
    """Starts `ranks` (default all) of a `world`-rank run by hand; returns [(rc, output)].
    A free port can be taken by another test between choosing and binding it: then rank 0
    says it could not host the store, and the run is tried again on another port."""
    for attempt in range(3):
        res, t = run_ranks_once(worker, mode, world, deadline, tmp, ranks, env_extra, first_exit,
                                **kv)
        if "could not host the rendezvous store" not in res[0][1] or attempt == 2:
            return res, t
        print(f"dist: port taken meanwhile, attempt {attempt + 2}")


def run_ranks_once(worker, mode, world, deadline, tmp, ranks, env_extra, first_exit, **kv):
    port = free_port()
    args = [f"{k}={v}" for k, v in kv.items()]
    procs, logs = [], []
    for r in (range(world) if ranks is None else ranks):
        env = base_env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port, **(env_extra or {}))
        log = open(tmp / f"{mode}_rank{r}.log", "w+b")
        logs.append(log)
        procs.append(start([worker, mode] + args, env, log))
    return wait_all(procs, logs, deadline, first_exit)


def wait_all(procs, logs, deadline, first_exit=None):
    start_time = time.monotonic()
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() - start_time > deadline:
                raise Failure(f"still running after the {deadline} s deadline")
            if first_exit is not None and procs[0].poll() is not None:
                break
            time.sleep(0.05)
    finally:
        kill(procs)
    out = []
    for p, log in zip(procs, logs):
        log.seek(0)
        out.append((p.returncode, log.read().decode(errors="replace")))
        log.close()
    return out, time.monotonic() - start_time


def expect(results, want_rc, *needles, ranks=None):
    for i, (rc, text) in enumerate(results):
        if ranks is not None and i not in ranks:
            continue
        if rc != want_rc:
            raise Failure(f"rank {i}: exit {rc}, expected {want_rc}")
        for n in needles:
            if n not in text:
                raise Failure(f"rank {i}: output lacks {n!r}")


def python_sampler(n, world, rank, seed, epoch):
    """Python's torch.utils.data.DistributedSampler: rank `rank`'s indices of `world`."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True,
                                 seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def case_train(worker, tmp):
    res, t = run_ranks(worker, "train", 2, 120, tmp, steps=6)
    expect(res, 0, "setup: params from rank 0 equal", "grads equal, params equal after 6 steps",
           "done")
    # Each rank's loom::DistributedSampler, built from its loom::Ddp, against Python's sampler
    # for that rank of 2 (12 samples, seed 5, epoch 2: the worker's sampler_from_strategy).
    lists = []
    for r in range(2):
        want = python_sampler(12, 2, r, seed=5, epoch=2)
        needle = (f"rank {r}/2: sampler from the strategy: {len(want)} of 12 indices: "
                  f"[{' '.join(map(str, want))}]; the 2 ranks' lists disjoint and covering the "
                  f"dataset")
        expect(res, 0, needle, ranks=[r])
        lists.append(want)
    if sorted(lists[0] + lists[1]) != list(range(12)):
        raise Failure(f"Python's two sampler lists {lists} are not a partition of range(12)")
    return (f"2 ranks by hand, 6 steps, {t:.1f} s; DistributedSampler from Ddp: rank 0 "
            f"{lists[0]}, rank 1 {lists[1]}, Python's for rank 0 and 1 of 2, disjoint")


def torchrun_cmd(*extra):
    return [str(TORCHRUN), *extra, "--no-python"]


def case_torchrun(worker, tmp):
    log = open(tmp / "torchrun.log", "w+b")
    cmd = torchrun_cmd("--standalone", "--nproc-per-node=2") + [worker, "train", "steps=5"]
    res, t = wait_all([start(cmd, base_env(), log)], [log], 180)
    rc, text = res[0]
    if rc != 0 or text.count("params equal after 5 steps") != 2:
        raise Failure(f"torchrun exit {rc}; expected two ranks to report equal params")
    return f"torchrun --standalone --nproc-per-node=2, {t:.1f} s"


def case_nnodes(worker, tmp):
    port = free_port()
    procs, logs = [], []
    for node in range(2):
        log = open(tmp / f"node{node}.log", "w+b")
        logs.append(log)
        cmd = torchrun_cmd("--nnodes=2", f"--node-rank={node}", "--nproc-per-node=2",
                           "--master-addr=127.0.0.1", f"--master-port={port}")
        procs.append(start(cmd + [worker, "train", "steps=4"], base_env(), log))
    res, t = wait_all(procs, logs, 240)
    text = "".join(r[1] for r in res)
    if any(r[0] != 0 for r in res) or text.count("params equal after 4 steps") != 4:
        raise Failure("expected 4 ranks over two torchrun agents to report equal params")
    for r in range(4):  # torchrun's GROUP_RANK: the agent's --node-rank
        if f"rank {r}/4: node {r // 2}" not in text:
            raise Failure(f"rank {r}/4 did not report node {r // 2}")
    for r in range(4):
        if f"rank {r}/4: done" not in text:
            raise Failure(f"rank {r}/4 did not finish")
    return f"2 agents x 2 ranks (--nnodes=2, static rendezvous), {t:.1f} s"


def case_collectives(worker, tmp):
    (tmp / "alone").mkdir(parents=True, exist_ok=True)
    (tmp / "first.txt").unlink(missing_ok=True)
    res, t = run_ranks(worker, "collectives", 3, 120, tmp, dir=tmp)
    expect(res, 0, "collectives ok", "nested collectives ok, shapes refused, objects ok, "
           "rank zero first ok, node 0")
    for i, (_, text) in enumerate(res):  # then each rank alone, SingleProcess
        if text.count("nested collectives ok, shapes refused, objects ok, rank zero first ok, "
                      "node 0") != 2:
            raise Failure(f"rank {i}: the one-process collectives did not pass")
    if "rank-zero line" not in res[0][1] or any("rank-zero line" in r[1] for r in res[1:]):
        raise Failure("rank_zero_print printed on a rank other than 0, or not on rank 0")
    return f"3 ranks, {t:.1f} s"


def simple_case(mode, needle, what):
    """A case whose ranks (2) all exit 0 and print `needle`; it reports `what`."""
    def case(worker, tmp):
        res, t = run_ranks(worker, mode, 2, 120, tmp)
        expect(res, 0, needle)
        return f"2 ranks, {what}{t:.1f} s"
    return case


case_no_sync = simple_case("no_sync", "no_sync: first backward local yes", "")
case_hooks = simple_case("hooks", "hooks: buckets reduced per step k=1: 1 4 4; k=2: 4 4 4; "
                         "k=4: 4 4 4 (each once), params equal",
                         "a counting user hook, k = 1, 2, 4, ")
case_scaler = simple_case("scaler", "scaler: skipped together yes, state equal yes", "16-mixed, ")
case_recompute = simple_case("recompute", "recompute: gradients equal the averaged plain ones yes",
                             "activation checkpointing, 3 backwards, ")
case_fp8 = simple_case("fp8", "fp8: scales equal yes, input scale 224.000000",
                       "fp8-mixed delayed scaling, ")


def case_join(worker, tmp):
    # Every rank finishes within the 30 s deadline (c10d's timeout is 20 s), no hang.
    res, t = run_ranks(worker, "join", 2, 30, tmp)
    expect(res, 0, "join: 10 batches, params equal", ranks=[0])
    expect(res, 0, "join: 12 batches, params equal", ranks=[1])
    res, t2 = run_ranks(worker, "join", 2, 30, tmp, divide_initial=0)
    expect(res, 0, "params equal")
    res, t3 = run_ranks(worker, "join", 2, 30, tmp, **{"throw": 1})
    expect(res, 0, "join: error after 10 of 10 batches: loom::Ddp::join: rank 0 has run out of "
           "inputs before the others", ranks=[0])
    expect(res, 0, "join: error after 10 of 12 batches: loom::Ddp::join: rank 1 found that "
           "another rank has run out of inputs", ranks=[1])
    return (f"10 and 12 batches: joined in {t:.1f} s ({t2:.1f} s dividing by the ranks still "
            f"in); throw_on_early_termination: both ranks raised in {t3:.1f} s")


def case_shapes(worker, tmp):
    res, t = run_ranks(worker, "shapes", 2, 120, tmp)
    expect(res, 3, "loom::Error: loom::Ddp: the ranks' models differ: rank 1's 4 parameters do "
           "not have rank 0's shapes")
    return f"both ranks refused, {t:.1f} s"


def case_unused(worker, tmp):
    res, t = run_ranks(worker, "unused", 2, 120, tmp)
    expect(res, 3, "loom::Error: loom::Ddp:", "set loom::DdpOptions::find_unused_parameters")
    res2, t2 = run_ranks(worker, "unused", 2, 120, tmp, find_unused=1)
    expect(res2, 0, "unused: trained, params equal")
    return f"refused without the option ({t:.1f} s), trains with it ({t2:.1f} s)"


def case_fault(worker, tmp, fault):
    timeout_s = 5
    # Rank 0's exit ends the run: a stopped rank 1 never exits by itself (it is killed).
    res, t = run_ranks(worker, "fault", 2, timeout_s + 60, tmp, first_exit=True, steps=50,
                       stop_at=3, fault=fault, timeout_ms=timeout_s * 1000)
    rc, text = res[0]
    if rc != 3:
        raise Failure(f"rank 0: exit {rc}, expected 3 (a loom::Error)")
    # The roll call through the store names the lost peer (gloo's timeout names none).
    for n in ["setup: SIGPIPE ignored", "failed on rank 0 of 2 processes (timeout 5 s)",
              "did not answer a roll call through the rendezvous store within 2 s: rank 1 (127.",
              "Another rank has died"]:
        if n not in text:
            raise Failure(f"rank 0: output lacks {n!r}")
    # Rank 0 must leave within the timeout plus a few seconds of the fault.
    if t > timeout_s + 15:
        raise Failure(f"rank 0 took {t:.1f} s")
    return f"rank 1 got SIG{fault.upper()} at step 3: rank 0 left with a loom::Error after {t:.1f} s"


def case_env(worker, tmp):
    checks = [
        (dict(RANK=2, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=1),
         "RANK is 2 but WORLD_SIZE is 2"),
        (dict(RANK=0, WORLD_SIZE=2), "WORLD_SIZE is 2 but MASTER_ADDR is not set"),
        (dict(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1"), "but MASTER_PORT is not set"),
        (dict(RANK="one", WORLD_SIZE=2), 'RANK is "one", not a whole number'),
        (dict(WORLD_SIZE=0), "WORLD_SIZE is \"0\""),
        # Bad communication hooks, before any environment is read.
        (dict(hook="fp8"), 'unknown communication hook "fp8"; choose none, fp16 or bf16'),
        (dict(hook="empty"), 'loom::CommHook::user("mine"): the factory is empty'),
    ]
    for env, needle in checks:
        log = open(tmp / "env.log", "w+b")
        args = [f"hook={env.pop('hook')}"] if "hook" in env else []
        res, _ = wait_all([start([worker, "env", *args], base_env(**env), log)], [log], 30)
        rc, text = res[0]
        if rc != 3 or needle not in text:
            raise Failure(f"env {env}: exit {rc}, output {text!r}; expected {needle!r}")
    log = open(tmp / "env.log", "w+b")
    res, _ = wait_all([start([worker, "env"], base_env(), log)], [log], 30)
    if res[0][0] != 0:
        raise Failure("no torchrun variables: expected a one-process Ddp")
    return f"{len(checks)} bad environments and hooks refused, none set accepted"


def case_port(worker, tmp):
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        env = base_env(RANK=0, WORLD_SIZE=2, LOCAL_RANK=0, MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port)
        log = open(tmp / "port.log", "w+b")
        res, t = wait_all([start([worker, "train", "timeout_ms=5000"], env, log)], [log], 60)
    rc, text = res[0]
    if rc != 3 or "could not host the rendezvous store on 127.0.0.1:" not in text:
        raise Failure(f"exit {rc}; expected the store error")
    return f"rank 0 refused the busy port after {t:.1f} s"


def case_lone(worker, tmp):
    """A rank started alone fails within DdpOptions::timeout plus a few seconds, with a
    loom::Error naming the address, the rank and the timeout: rank 1 finds no store on the port
    (as with a wrong MASTER_PORT), rank 0 hosts one that no other rank joins."""
    timeout_s, slack_s = 5, 4
    seen = []
    for rank, needle in ((1, "rank 1 of 2 could not join the rendezvous store at 127.0.0.1:"),
                         (0, "rank 0 of 2 could not host the rendezvous store on 127.0.0.1:")):
        res, t = run_ranks_once(worker, "train", 2, 60, tmp, [rank], None, None,
                                timeout_ms=timeout_s * 1000)
        rc, text = res[0]
        if rc != 3 or needle not in text or f"within {timeout_s} s" not in text:
            raise Failure(f"rank {rank} alone: exit {rc}; expected a loom::Error with {needle!r} "
                          f"and 'within {timeout_s} s'")
        if t > timeout_s + slack_s:
            raise Failure(f"rank {rank} alone took {t:.1f} s (timeout {timeout_s} s)")
        seen.append(f"rank {rank} after {t:.1f} s")
    return f"alone, with a {timeout_s} s timeout, each failed with a loom::Error: " + ", ".join(seen)


def case_parity(worker, tmp):
    out = subprocess.run([sys.executable, str(HERE / "ddp_parity.py"), "--worker", worker,
                          "--dir", str(tmp / "parity")], capture_output=True, text=True,
                         timeout=600)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        raise Failure("parity: " + out.stderr[-4000:])
    return "see above"


def cuda_devices():
    """How many CUDA devices torch sees (the python running this script has torch)."""
    try:
        import torch
    except ImportError as e:
        raise Failure(f"the CUDA cases need torch in {sys.executable}: {e}")
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


SMOKE = "smoke test only: 1 GPU, nothing compared across ranks"


def case_cuda(worker, tmp, backend, zero=0, shared_gpu=False, env_extra=None):
    """NCCL (`shared_gpu` False): 2 ranks on GPUs 0 and 1 (each its LOCAL_RANK's) when torch sees
    2 or more; on one GPU a single rank, which can only be compared with a one-process run (a
    smoke test, said in the result line). gloo (`shared_gpu`): 2 ranks on GPU 0. `env_extra`:
    more variables for the ranks (TORCH_DISTRIBUTED_DEBUG=DETAIL: c10d's ProcessGroupWrapper
    checks every collective)."""
    gpus = cuda_devices()
    if gpus == 0:
        raise Failure("torch sees no CUDA device")
    name = backend + (f" zero{zero}" if zero else "")
    if shared_gpu or gpus >= 2:
        gpu = 0 if shared_gpu else "local"
        res, t = run_ranks(worker, "cuda", 2, 300, tmp, env_extra=env_extra, backend=backend,
                           gpu=gpu, zero=zero)
        for r in range(2):
            expect(res, 0, f"cuda {name}: 2 ranks, params on cuda:{0 if shared_gpu else r}, "
                   "equal across ranks at setup yes, after 5 steps yes, all_reduce ok",
                   ranks=[r])
        where = "one GPU" if shared_gpu else "GPUs 0 and 1"
        return (f"2 ranks, {name} on {where} ({gpus} seen), compared across ranks, "
                f"{t:.1f} s")
    res, t = run_ranks(worker, "cuda", 1, 300, tmp, env_extra=env_extra, backend=backend, gpu=0,
                       zero=zero)
    expect(res, 0, f"cuda {name}: 1 rank, params on cuda:0 ({SMOKE}); against the same 5 steps "
           "without a strategy: max|diff| ", "within 1e-6 yes")
    line = next(x for x in res[0][1].splitlines() if f"cuda {name}: 1 rank" in x)
    return (f"{SMOKE}; 1 rank, {name} on cuda:0, {t:.1f} s; "
            + line.split("; ", 1)[1])


CASES = {
    "train": case_train, "torchrun": case_torchrun, "nnodes": case_nnodes,
    "collectives": case_collectives, "no_sync": case_no_sync, "hooks": case_hooks, "join": case_join, "scaler": case_scaler,
    "fp8": case_fp8, "recompute": case_recompute,
    "shapes": case_shapes, "unused": case_unused, "env": case_env, "port": case_port,
    "lone": case_lone,
    "kill": lambda w, t: case_fault(w, t, "kill"), "stop": lambda w, t: case_fault(w, t, "stop"),
    "parity": case_parity,
    "cuda_nccl": lambda w, t: case_cuda(w, t, "nccl"),
    "cuda_gloo": lambda w, t: case_cuda(w, t, "gloo", shared_gpu=True),
    "cuda_zero": lambda w, t: case_cuda(w, t, "nccl", zero=2),
    # The same collectives through c10d's ProcessGroupWrapper (gloo on CUDA tensors, 2 ranks).
    "cuda_detail": lambda w, t: case_cuda(w, t, "gloo", shared_gpu=True,
                                          env_extra={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("case", choices=sorted(CASES))
    a = ap.parse_args()
    tmp = Path(a.tmp or f"dist_{a.case}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        what = CASES[a.case](a.worker, tmp)
    except Failure as e:
        print(f"dist {a.case}: FAILED: {e}")
        for log in sorted(tmp.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        sys.exit(1)
    print(f"dist {a.case}: ok, {what}")


if __name__ == "__main__":
    main()
