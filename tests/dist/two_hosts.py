"""Two machines, for real: loom::Ddp and loom::Zero over two torchrun agents, each in a network
namespace of its own, the two joined by a veth pair (10.77.0.1/24 and 10.77.0.2/24), against the
same run on one host.

  python two_hosts.py --bin build/tests/loom_resume [--tmp DIR]

Every run is tests/checkpoint/resume.cpp's trainer, 30 steps, 32-true, Adam, 4 ranks, a 20 s
process-group timeout:

 1. one host: torchrun --standalone --nproc-per-node=4 on loopback (GLOO_SOCKET_IFNAME=lo), in a
    namespace of its own, under loom::Ddp and loom::Zero stage 2: the reference states;
 2. two hosts: one agent in each namespace (--nnodes=2 --nproc-per-node=2, c10d rendezvous at
    10.77.0.1), GLOO_SOCKET_IFNAME the namespace's veth, Ddp and Zero stage 2: each final state
    bitwise equal to the one-host one (tests/checkpoint/same_state.py);
 3. netem: 20 ms delay and 1% loss on both ends of the link, Ddp, bitwise again, timed; where the
    kernel has no sch_netem this part prints "netem: LOOM-SKIPPED-PART: ..." and the rest goes on;
 4. partition: Ddp with a checkpoint directory (every 5 steps, 100 ms a step); once a rank reached
    step 12, host b's link goes down: every rank must exit non-zero within the timeout + 10 s,
    and print an error naming the host it lost (the roll call through the store: ranks on host a
    name the ranks of host b and their address, ranks on host b the store's host, a); then the
    link comes up, two fresh agents on the same directory resume from its last checkpoint and end
    bitwise equal to the one-host run. Where they do not, the same kill and resume on one host
    says whether the network or the resume is to blame.

The namespaces share the machine's hostname, which resolves outside them, so each agent gets
--local-addr (the address its ranks reach it at: torchrun gives it to the workers as MASTER_ADDR)
and --rdzv-conf=is_host=1|0 (torchrun hosts the rendezvous store where the endpoint is one of the
hostname's addresses); between real machines, the hostname does both. Every rendezvous port is in
a namespace this run made, so nothing else can hold it.

Where namespaces cannot be made (not root, no iproute2, no veth) it prints "LOOM-SKIPPED:
<reason>" and exits 0 (ctest counts it as skipped). Every process the test starts runs in one of
its namespaces (named after its pid), so the cleanup, after a failure, Ctrl-C or SIGTERM too, kills
what `ip netns pids` lists and deletes the namespaces; a run that was SIGKILLed leaves them to the
next run, which removes them. It prints "dist two_hosts: ok, ..." with the timings, or
"dist two_hosts: FAILED: ..." and the logs' tails, and exits 1.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "checkpoint")]
from run_dist import TORCHRUN, base_env, become_subreaper, reap  # noqa: E402
from same_state import count_tensors, same  # noqa: E402

STEPS = 30
TIMEOUT_S = 20  # the process group's timeout (loom::DdpOptions::timeout)
COMMON = ["precision=32-true", "optimizer=adam", f"steps={STEPS}",
          f"timeout_ms={TIMEOUT_S * 1000}"]
PARTITION_STRATEGY = "ddp"
CUT_AT = 12  # the partition: the link goes down once a rank printed this step
STEP_MS = 100
LAUNCH_DEADLINE = 120  # one torchrun launch, start to end (about 5-15 s when it works)
TOTAL_DEADLINE = 280  # the launches; with the partition's waits and the cleanup, under ctest's 400
PREFIX = "loom2h"  # namespaces and veths: loom2h<pid>a, loom2h<pid>b, loom2h<pid>c
ADDR = {"a": "10.77.0.1", "b": "10.77.0.2"}
NETEM = ["delay", "20ms", "loss", "1%"]


class Failure(Exception):
    pass


class Skip(Exception):
    pass


class Interrupted(BaseException):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def sh(*cmd, ok=True, timeout=20):
    """Runs a short command (ip, tc); with ok, a non-zero exit is a Failure."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if ok and r.returncode != 0:
        raise Failure(f"`{' '.join(cmd)}` exited {r.returncode}: {r.stdout.strip()}")
    return r


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def namespace_pids(ns):
    r = sh("ip", "netns", "pids", ns, ok=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()] if r.returncode == 0 else []


def empty_namespace(ns, bound=10.0):
    """SIGKILLs every process in `ns` until none is left (at most `bound` s); how many."""
    killed, end = set(), time.monotonic() + bound
    while time.monotonic() < end:
        pids = [p for p in namespace_pids(ns) if p != os.getpid()]
        if not pids:
            return len(killed)
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                killed.add(p)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    raise Failure(f"processes {namespace_pids(ns)} in namespace {ns} outlived SIGKILL by {bound} s")


def remove_stale():
    """Deletes the namespaces of earlier runs whose test process is gone (a SIGKILLed run)."""
    r = sh("ip", "netns", "list", ok=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}(\d+)[abc]", name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{m.group(1)}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if b"two_hosts.py" in cmdline:
            continue  # a run going on beside this one
        n = empty_namespace(name)
        r = sh("ip", "netns", "del", name, ok=False)
        print(f"two_hosts: namespace {name} of a run that is gone ({n} processes killed): "
              + ("deleted" if r.returncode == 0 else f"`ip netns del` failed: {r.stdout.strip()}"))


class Hosts:
    """Host a and host b (a veth pair between two namespaces), and one namespace with only `lo`
    for the one-host runs."""

    def __init__(self):
        tag = f"{PREFIX}{os.getpid()}"
        self.ns = {"a": tag + "a", "b": tag + "b", "one": tag + "c"}
        self.veth = {"a": tag + "a", "b": tag + "b"}  # each veth is named after its namespace
        self.made = []

    def make(self):
        if os.geteuid() != 0:
            raise Skip("not root: making network namespaces (ip netns add) needs CAP_SYS_ADMIN")
        if shutil.which("ip") is None:
            raise Skip("no `ip` command (iproute2) to make network namespaces with")
        remove_stale()
        for ns in self.ns.values():
            r = sh("ip", "netns", "add", ns, ok=False)
            if r.returncode != 0:
                raise Skip(f"cannot make a network namespace: `ip netns add {ns}`: "
                           f"{r.stdout.strip()}")
            self.made.append(ns)
        r = sh("ip", "link", "add", self.veth["a"], "netns", self.ns["a"], "type", "veth", "peer",
               "name", self.veth["b"], "netns", self.ns["b"], ok=False)
        if r.returncode != 0:
            raise Skip(f"cannot make a veth pair between two namespaces: {r.stdout.strip()}")
        for h in ("a", "b"):
            sh("ip", "-n", self.ns[h], "addr", "add", f"{ADDR[h]}/24", "dev", self.veth[h])
            sh("ip", "-n", self.ns[h], "link", "set", self.veth[h], "up")
        for ns in self.ns.values():
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        r = sh("ip", "netns", "exec", self.ns["a"], sys.executable, "-c", "pass", ok=False)
        if r.returncode != 0:
            raise Skip(f"cannot run a process in a network namespace (`ip netns exec`): "
                       f"{r.stdout.strip()}")

    def link(self, host, state):
        sh("ip", "-n", self.ns[host], "link", "set", self.veth[host], state)

    def cleanup(self):
        """Kills every process in the namespaces, then deletes them; what it did."""
        killed, errors = 0, []
        for ns in list(self.made):
            try:
                killed += empty_namespace(ns)
                r = sh("ip", "netns", "del", ns, ok=False)
                if r.returncode != 0:
                    errors.append(f"ip netns del {ns}: {r.stdout.strip()}")
                else:
                    self.made.remove(ns)
            except (Failure, OSError, subprocess.SubprocessError) as e:
                errors.append(str(e))
        left = [ns for ns in self.ns.values()
                if ns in sh("ip", "netns", "list", ok=False).stdout.split()]
        if left:
            errors.append(f"namespaces left: {left}")
        return killed, errors


class Launch:
    """torchrun agents started together, one per namespace; each agent's output in a log file,
    each rank's in files of its own (--redirects=3 under --log-dir)."""

    def __init__(self, name, tmp, end):
        self.name, self.tmp, self.end = name, tmp / name, end
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.procs, self.logs, self.t0 = [], [], time.monotonic()

    def start(self, host, ns, flags, cmd, env):
        log = open(self.tmp / f"agent_{host}.log", "w+b")
        self.logs.append(log)
        argv = ["ip", "netns", "exec", ns, str(TORCHRUN), *flags, "--max-restarts=0",
                "--monitor-interval=0.1", f"--log-dir={self.tmp / ('ranks_' + host)}",
                "--redirects=3", "--no-python", *cmd]
        self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def rank_files(self):
        return sorted(self.tmp.glob("ranks_*/*/attempt_*/*/std*.log"))

    def rank_text(self):
        return "".join(p.read_text(errors="replace") for p in self.rank_files())

    def by_rank(self):
        """Each rank's output (stdout, then stderr), keyed by the rank it printed (or, for one
        that printed none, 'host H local L')."""
        dirs = sorted({f.parent for f in self.rank_files()})
        out = {}
        for d in dirs:
            text = "".join((d / n).read_text(errors="replace")
                           for n in ("stdout.log", "stderr.log") if (d / n).exists())
            m = re.search(r"^loom_resume: rank (\d+) ", text, re.M)
            host = d.relative_to(self.tmp).parts[0].removeprefix("ranks_")
            out[int(m.group(1)) if m else f"host {host} local {d.name}"] = text
        return out

    def agent_text(self, i):
        self.logs[i].flush()
        return (self.tmp / Path(self.logs[i].name).name).read_text(errors="replace")

    def wait_for(self, pattern):
        """The first match of `pattern` in the ranks' output; a Failure at the deadline or when
        every agent has exited without it."""
        rx = re.compile(pattern, re.M)
        while True:
            m = rx.search(self.rank_text())
            if m:
                return m
            if all(p.poll() is not None for p in self.procs):
                m = rx.search(self.rank_text())
                if m:
                    return m
                raise Failure(f"{self.name}: no {pattern!r}: the agents exited "
                              f"{[p.returncode for p in self.procs]}")
            if time.monotonic() > self.end:
                raise Failure(f"{self.name}: no {pattern!r} before the deadline")
            time.sleep(0.02)

    def wait(self, end=None):
        """Waits for every agent (a Failure at the deadline); their exit codes and the time."""
        end = min(end or self.end, self.end)
        while any(p.poll() is None for p in self.procs):
            if time.monotonic() > end:
                raise Failure(f"{self.name}: still running after {time.monotonic() - self.t0:.0f} "
                              "s, at its deadline")
            time.sleep(0.05)
        return [p.returncode for p in self.procs], time.monotonic() - self.t0

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for log in self.logs:
            log.close()

    def tails(self):
        """The end of every agent's and every rank's output, for a failure report."""
        parts = []
        for f in sorted(self.tmp.glob("agent_*.log")) + self.rank_files():
            lines = [x for x in f.read_text(errors="replace").splitlines()
                     if x.strip() and not x.startswith("frame #")]  # c10d's C++ stack frames
            keep = 3 if f.name == "stdout.log" else 25  # progress lines: the last few
            if lines:
                parts.append(f"--- {f.relative_to(self.tmp.parent)}\n" + "\n".join(lines[-keep:]))
        return "\n".join(parts)


class Test:
    def __init__(self, bin_, tmp, hosts):
        self.bin, self.tmp, self.hosts = bin_, tmp, hosts
        self.end = time.monotonic() + TOTAL_DEADLINE
        self.launches, self.port = [], 29400

    def launch(self, name):
        l = Launch(name, self.tmp, min(self.end, time.monotonic() + LAUNCH_DEADLINE))
        self.launches.append(l)
        return l

    def one_host(self, name, args):
        l = self.launch(name)
        l.start("one", self.hosts.ns["one"],
                ["--standalone", "--nproc-per-node=4", "--local-addr=127.0.0.1"],
                [str(self.bin)] + args, base_env(GLOO_SOCKET_IFNAME="lo"))
        return l

    def two_hosts(self, name, args):
        """Agent a (hosts the rendezvous) and agent b, 2 ranks each."""
        self.port += 1  # a new port for each rendezvous: no TIME_WAIT of the one before
        l = self.launch(name)
        for i, h in enumerate(("a", "b")):
            l.start(h, self.hosts.ns[h],
                    ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint={ADDR['a']}:{self.port}", f"--rdzv-id={name}",
                     f"--rdzv-conf=is_host={1 if i == 0 else 0}", f"--local-addr={ADDR[h]}"],
                    [str(self.bin)] + args, base_env(GLOO_SOCKET_IFNAME=self.hosts.veth[h]))
        return l

    def finish(self, l):
        """Waits for a launch that must succeed; its time."""
        try:
            codes, t = l.wait()
        finally:
            l.kill()
        check(all(c == 0 for c in codes), f"{l.name}: torchrun exited {codes}, want all 0")
        return t

    def spread(self, l):
        """Checks that each agent ran two of the four ranks (which two: the rendezvous' order)."""
        for h in ("a", "b"):
            text = "".join(f.read_text(errors="replace")
                           for f in l.rank_files() if f.relative_to(l.tmp).parts[0] == f"ranks_{h}")
            ranks = sorted(set(re.findall(r"^loom_resume: rank (\d) of 4,", text, re.M)))
            check(ranks in (["0", "1"], ["2", "3"]),
                  f"{l.name}: host {h} ran ranks {ranks}, want two of the 4 (0 1 or 2 3)")

    def compare(self, want, got, what):
        a, b = torch.load(want), torch.load(got)
        try:
            same(a, b, what)
        except AssertionError as e:
            raise Failure(f"{what}: not bitwise equal to the one-host run: {e}")
        check(b["step"] == STEPS, f"{what}: step {b['step']!r}, want {STEPS}")
        return count_tensors(a)

    def run(self):
        times, notes = {}, []
        ref = {}
        for strategy in ("ddp", "zero2"):
            ref[strategy] = self.tmp / f"one_host_{strategy}.pt"
            ref[strategy].unlink(missing_ok=True)
            l = self.one_host(f"one_host_{strategy}",
                              COMMON + [f"strategy={strategy}", f"out={ref[strategy]}"])
            times[f"one host {strategy}"] = self.finish(l)
            ranks = len(torch.load(ref[strategy])["runtime"]["device"])
            check(ranks == 4, f"one host {strategy}: the state holds {ranks} ranks, want 4")
            print(f"one host, {strategy}: 4 ranks on lo, {times[f'one host {strategy}']:.1f} s",
                  flush=True)

        for strategy in ("ddp", "zero2"):
            out = self.tmp / f"two_hosts_{strategy}.pt"
            out.unlink(missing_ok=True)
            l = self.two_hosts(f"two_hosts_{strategy}",
                               COMMON + [f"strategy={strategy}", f"out={out}"])
            times[f"two hosts {strategy}"] = t = self.finish(l)
            self.spread(l)
            n = self.compare(ref[strategy], out, f"two hosts {strategy}")
            print(f"two hosts, {strategy}: 2 agents x 2 ranks over the veth, {t:.1f} s; {n} "
                  f"tensors bitwise equal to one host", flush=True)

        netem = self.netem(ref["ddp"])
        if isinstance(netem, str):
            notes.append(f"netem skipped ({netem})")
        else:
            times["two hosts ddp, netem 20 ms 1% loss"] = netem

        part = self.partition(ref[PARTITION_STRATEGY])
        times.update(part.pop("times"))
        return times, part, notes

    def netem(self, ref):
        """Ddp over a link with 20 ms of delay and 1% loss each way: its time, or why it was
        skipped (no tc, or a kernel without the netem qdisc)."""
        if shutil.which("tc") is None:
            print("netem: LOOM-SKIPPED-PART: no `tc` command (iproute2) to add a netem qdisc with; "
                  "the run over a slow and lossy link was not made, the rest goes on", flush=True)
            return "no tc"
        added = []
        try:
            for h in ("a", "b"):
                r = sh("tc", "-n", self.hosts.ns[h], "qdisc", "add", "dev", self.hosts.veth[h],
                       "root", "netem", *NETEM, ok=False)
                if r.returncode != 0 and "qdisc kind is unknown" in r.stdout:
                    print(f"netem: LOOM-SKIPPED-PART: the kernel has no sch_netem (`tc qdisc add "
                          f"... netem {' '.join(NETEM)}` said: {r.stdout.strip()}); the run over "
                          "a slow and lossy link was not made, the rest goes on", flush=True)
                    return "no sch_netem"
                check(r.returncode == 0, f"netem: `tc qdisc add ... netem` on host {h} exited "
                      f"{r.returncode}: {r.stdout.strip()}")
                added.append(h)
            out = self.tmp / "netem_ddp.pt"
            out.unlink(missing_ok=True)
            l = self.two_hosts("netem_ddp", COMMON + ["strategy=ddp", f"out={out}"])
            t = self.finish(l)
            n = self.compare(ref, out, "two hosts ddp under netem")
            print(f"netem: {' '.join(NETEM)} on both ends, ddp: {t:.1f} s; {n} tensors bitwise "
                  "equal to one host", flush=True)
            return t
        finally:
            for h in added:
                sh("tc", "-n", self.hosts.ns[h], "qdisc", "del", "dev", self.hosts.veth[h], "root",
                   ok=False)

    def checkpointed(self, name):
        """A fresh checkpoint directory and final state file for a run that saves every 5 steps:
        (directory, file, loom_resume's arguments)."""
        d = self.tmp / f"{name}_dir"
        shutil.rmtree(d, ignore_errors=True)
        out = self.tmp / f"{name}.pt"
        out.unlink(missing_ok=True)
        return d, out, COMMON + [f"strategy={PARTITION_STRATEGY}", f"dir={d}", "every=5",
                                 f"step_ms={STEP_MS}", f"out={out}"]

    def partition(self, ref):
        d, out, args = self.checkpointed("partition")
        l = self.two_hosts("partition", args)
        try:
            l.wait_for(rf"^loom_resume: rank \d step {CUT_AT}$")
            text = l.rank_text()
            pids = {int(r): int(p) for r, p in
                    re.findall(r"^loom_resume: rank (\d) pid (\d+) attempt", text, re.M)}
            check(sorted(pids) == [0, 1, 2, 3], f"partition: ranks {sorted(pids)} printed their "
                  "pid, want 0 1 2 3")
            t_cut = time.monotonic()
            self.hosts.link("b", "down")
            cut_step = max(int(n) for n in re.findall(r"^loom_resume: rank \d step (\d+)$",
                                                      l.rank_text(), re.M))
            gone = {}
            bound = t_cut + TIMEOUT_S + 30  # measured up to here; required within timeout + 10
            while len(gone) < 4 and time.monotonic() < bound:
                for r, p in pids.items():
                    if r not in gone and not alive(p):
                        gone[r] = time.monotonic() - t_cut
                time.sleep(0.02)
            # The agents: agent a reports its ranks' exit codes; agent b, cut off from the
            # rendezvous store on host a, may wait for it: the link comes up once the ranks are
            # gone (as before a relaunch), and each agent gets 30 s more to report and leave.
            t_gone = time.monotonic()
            agents = []
            while time.monotonic() < t_gone + 3 and any(p.poll() is None for p in l.procs):
                time.sleep(0.05)
            for h, p in zip(("a", "b"), l.procs):
                if p.poll() is not None:
                    agents.append(f"agent {h} exited {p.returncode} "
                                  f"{time.monotonic() - t_cut:.1f} s after the cut")
            self.hosts.link("b", "up")
            try:
                l.wait(end=time.monotonic() + 30)
            except Failure:
                pass
            for h, p in zip(("a", "b"), l.procs):
                if not any(a.startswith(f"agent {h} ") for a in agents):
                    agents.append(f"agent {h} exited {p.returncode} "
                                  f"{time.monotonic() - t_cut:.1f} s after the cut, after the "
                                  "link came up" if p.poll() is not None else
                                  f"agent {h} still running 30 s after the link came up; killed")
            agent_text = "".join(l.agent_text(i) for i in range(len(l.procs)))
            by_rank = l.by_rank()
        finally:
            l.kill()
            self.hosts.link("b", "up")
        slow = {r: t for r, t in gone.items() if t > TIMEOUT_S + 10}
        check(len(gone) == 4 and not slow,
              f"partition: ranks gone after the cut (s): {fmt(gone)}; want all 4 within "
              f"{TIMEOUT_S} + 10 s; {'; '.join(agents)}")
        # Exit codes: torchrun's failure report ("rank : R (local_rank: L)", "exitcode : C");
        # for a rank no agent reported, its error line: loom_resume prints the exception that
        # ended it and returns 1.
        reported = {int(r): int(c) for r, c in re.findall(
            r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", agent_text)}
        errors = error_lines(by_rank)
        exits = {}
        for r in range(4):
            said = any(line.startswith(f"rank {r}: loom_resume: ") for line in errors)
            if r in reported:
                exits[r] = f"{reported[r]} (torchrun)"
            elif said:
                exits[r] = "1 (its error line; no agent reported it)"
            check(r in exits and reported.get(r, 1) != 0,
                  f"partition: rank {r}: exit {reported.get(r, 'not reported')}, error line "
                  f"{'printed' if said else 'none'}; want a non-zero exit")
        print(f"partition: link of host b down at step {cut_step}; ranks gone after (s): "
              f"{fmt(gone)} (timeout {TIMEOUT_S} s); exit codes: {fmt(exits, '{}')}; "
              f"{'; '.join(agents)}", flush=True)
        for line in errors:
            print(f"partition: rank error: {line}", flush=True)
        quiet = [r for r in range(4) if not any(line.startswith(f"rank {r}: ") for line in errors)]
        check(not quiet, f"partition: rank(s) {quiet} exited without printing an error")
        # Each rank names the host it lost: the roll call's sentence, with the other's address.
        peer = re.compile(r"did not answer a roll call.*rank \d \((10\.77\.0\.\d)"
                          r"|does not answer this rank either.*lost its link to (10\.77\.0\.\d)")
        named = {}
        for line in errors:
            m = peer.search(line) if line.startswith("rank ") else None
            if m:
                named.setdefault(int(line.split(":")[0].split()[1]), m.group(1) or m.group(2))
        check(len(named) == 4 and set(named.values()) == set(ADDR.values()),
              f"partition: want every rank's error to name the lost host (ranks of one host the "
              f"other's address), got {named}")
        print(f"partition: every rank names the host it lost: {fmt(named, '{}')}", flush=True)

        files = sorted(os.listdir(d))
        latest = (d / "latest").read_text().strip() if (d / "latest").exists() else None
        check(latest is not None, f"partition: no checkpoint was written before the cut: {files}")
        l = self.two_hosts("partition_resume", args)
        t_resume = self.finish(l)
        text = l.rank_text()
        resumed = re.findall(
            r"^loom_resume: rank (\d) pid \d+ attempt \S+ resumed from step (\d+)$", text, re.M)
        steps = {int(s) for _, s in resumed}
        check(len(resumed) == 4 and len(steps) == 1,
              f"partition: relaunch: want 4 ranks 'resumed from step N' with one N, got {resumed}")
        s = steps.pop()
        check(s % 5 == 0 and 10 <= s <= cut_step + 1,
              f"partition: resumed from step {s}, want a multiple of 5 in 10..{cut_step + 1}")
        try:
            n = self.compare(ref, out, "partition + resume")
        except Failure as e:
            raise Failure(f"{e}. {self.diagnose(ref, out, s)}")
        print(f"partition: link up again; a fresh pair of agents resumed from step {s} ({latest} "
              f"of {files}) and ended bitwise equal to one host ({n} tensors), {t_resume:.1f} s",
              flush=True)
        return {"times": {"partition: ranks out after the cut": max(gone.values()),
                          "partition: resume": t_resume},
                "cut_step": cut_step, "resumed": s}

    def diagnose(self, ref, out, s):
        """After a resume that is not bitwise: the same on one host (4 ranks on loopback, all
        SIGKILLed after step s + 2, relaunched on the directory), to tell a resume that is never
        bitwise at this world size from one the partition spoilt."""
        d, one, args = self.checkpointed("one_host_resume")
        l = self.one_host("one_host_killed", args)
        try:
            l.wait_for(rf"^loom_resume: rank \d step {s + 2}$")
            empty_namespace(self.hosts.ns["one"])
        finally:
            l.kill()
        l = self.one_host("one_host_resume", args)
        self.finish(l)
        got = re.findall(r"resumed from step (\d+)$", l.rank_text(), re.M)
        if got != [str(s)] * 4:
            return f"(one host, killed at step {s + 2} and relaunched, resumed from {got})"
        try:
            same(torch.load(one), torch.load(ref), "one host")
            return (f"One host, the same kill at step {s + 2} and resume from step {s} ends "
                    "bitwise equal to the uninterrupted run: the partition's resume differs")
        except AssertionError as e:
            first = str(e)
        try:
            same(torch.load(one), torch.load(out), "one host")
            equal = "bitwise equal to the partition's resumed run"
        except AssertionError as e:
            equal = f"different from the partition's resumed run too ({e})"
        return (f"On one host too, 4 ranks killed at step {s + 2} and resumed from step {s} "
                f"differ from the uninterrupted run ({first}), {equal}: a resume under "
                f"{PARTITION_STRATEGY} with 4 ranks is not bitwise, whatever the network")


def fmt(d, spec="{:.1f}"):
    return ", ".join(f"rank {k} {spec.format(v)}" for k, v in sorted(d.items()))


ROUTINE = re.compile(r"^loom_resume: rank \d+ (step \d+|pid \d+ .*|of \d+, .*)$"
                     r"|The hostname of the client socket cannot be retrieved")


def error_lines(by_rank):
    """Each rank's lines other than its routine ones (progress, and c10d's warning that a peer's
    address has no name), as 'rank R: LINE': what it printed about the failure."""
    return [f"{'rank ' if isinstance(r, int) else ''}{r}: {line}"
            for r, text in sorted(by_rank.items(), key=lambda kv: str(kv[0]))
            for line in text.splitlines() if line.strip() and not ROUTINE.search(line)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="loom_resume (tests/checkpoint/resume.cpp)")
    ap.add_argument("--tmp", default="dist_two_hosts")
    a = ap.parse_args()
    tmp = Path(a.tmp).resolve()
    tmp.mkdir(parents=True, exist_ok=True)
    binary = Path(a.bin).resolve()

    def interrupted(signum, _frame):
        raise Interrupted(f"signal {signum}")

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, interrupted)
    hosts = Hosts()
    test = None
    result, code = None, 1
    t0 = time.monotonic()
    try:
        become_subreaper()
        hosts.make()
        test = Test(binary, tmp, hosts)
        result = test.run()
        code = 0
    except Skip as e:
        print(f"LOOM-SKIPPED: dist two_hosts: {e}")
        code = 0
    except (Failure, OSError, subprocess.SubprocessError) as e:
        print(f"dist two_hosts: FAILED: {e}")
    except Interrupted as e:
        print(f"dist two_hosts: FAILED: interrupted by {e}")
    finally:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)  # the cleanup is not interrupted
        if test is not None:
            for l in test.launches:
                l.kill()
            if code != 0:
                for l in test.launches[-3:]:
                    print(l.tails())
        killed, errors = hosts.cleanup()
        reap()
    if errors:
        print(f"dist two_hosts: FAILED: cleanup: {'; '.join(errors)}")
        sys.exit(1)
    if result is None:
        sys.exit(code)
    times, part, notes = result
    print(f"two_hosts: cleanup: {killed} processes left to kill, namespaces deleted")
    print(f"dist two_hosts: ok, {time.monotonic() - t0:.0f} s; "
          + "; ".join(f"{k} {v:.1f} s" for k, v in times.items())
          + f"; resumed from step {part['resumed']} after the cut at step {part['cut_step']}, "
          "bitwise" + "".join(f"; {n}" for n in notes))


if __name__ == "__main__":
    main()
