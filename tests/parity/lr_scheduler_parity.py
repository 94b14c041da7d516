"""Fixture and checks of loom's LR-scheduler parity test (tests/unit/optim/lr_scheduler_test.cpp).

  python lr_scheduler_parity.py OUTPUT_FILE        writes the fixture
  python lr_scheduler_parity.py --check FIXTURE    checks the states loom wrote

Writing: for every case, a Python scheduler over two param groups steps STEPS times; a step is
applied or skipped by a fixed random mask, and scheduler.step() runs only after applied steps
(what loom's step(StepResult) does; ReduceLROnPlateau steps with the case's metric where the
mask is 1). The fixture holds each case's settings, the mask, the metrics and the lr (and
momentum) of every group after every step, as exact hex floats; and after RESUME steps
Python's state_dict goes to FIXTURE.<case>.py.pt (torch.save), for loom to resume from.

Checking: loom wrote its state_dict after RESUME steps to FIXTURE.<case>.cpp.pt (pickle_save).
It must have Python's keys, in Python's order, with equal values of the same types; and a fresh
Python scheduler that loads it must then give the same lrs as the uninterrupted run.
"""

import random
import sys
import warnings

import torch
import torch.jit._pickle as jp
from torch.optim import lr_scheduler as L

STEPS = 60
RESUME = 27
LRS = (0.1, 0.05)

# name, optimizer, scheduler, settings (the same words go to the fixture for loom)
CASES = [
    ("step", "sgd", "StepLR", dict(step_size=7, gamma=0.5)),
    ("multistep", "sgd", "MultiStepLR", dict(milestones=[5, 12, 12, 30], gamma=0.3)),
    ("linear", "sgd", "LinearLR", dict(start_factor=0.25, end_factor=0.9, total_iters=20)),
    ("cosine", "adam", "CosineAnnealingLR", dict(T_max=17, eta_min=0.001)),
    ("warmup_cosine", "sgd", "WarmupCosineLR",
     dict(warmup_steps=8, total_steps=50, warmup_start_factor=0.01, eta_min=1e-4)),
    ("onecycle", "sgd", "OneCycleLR", dict(max_lr=[0.5, 0.2], total_steps=STEPS)),
    ("onecycle_linear3_adam", "adam", "OneCycleLR",
     dict(max_lr=0.01, total_steps=STEPS, pct_start=0.25, anneal_strategy="linear",
          three_phase=True, base_momentum=0.8, max_momentum=0.9)),
    ("exponential", "adam", "ExponentialLR", dict(gamma=0.93)),
    ("polynomial", "sgd", "PolynomialLR", dict(total_iters=25, power=1.7)),
    ("warm_restarts", "sgd", "CosineAnnealingWarmRestarts", dict(T_0=7, T_mult=2, eta_min=0.002)),
    ("lambda", "adam", "LambdaLR", dict(factor=0.97)),  # lr_lambda: factor ** position
    # ChainedScheduler([LinearLR(start_factor, end_factor, total_iters), ExponentialLR(gamma)])
    ("chained", "sgd", "ChainedScheduler",
     dict(start_factor=0.2, end_factor=1.0, total_iters=12, gamma=0.95)),
    # stepped with the case's metric where the mask says an evaluation happened
    ("plateau_min", "sgd", "ReduceLROnPlateau",
     dict(mode="min", factor=0.5, patience=3, threshold=0.01, cooldown=2, min_lr=[0.01, 0.004])),
    ("plateau_max_abs", "adam", "ReduceLROnPlateau",
     dict(mode="max", factor=0.7, patience=2, threshold=0.005, threshold_mode="abs", eps=1e-3)),
]


def make(opt_name, sched, settings):
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    groups = [{"params": [params[0]], "lr": LRS[0]}, {"params": [params[1]], "lr": LRS[1]}]
    if opt_name == "sgd":
        opt = torch.optim.SGD(groups, lr=LRS[0], momentum=0.9)
    else:
        opt = torch.optim.Adam(groups, lr=LRS[0])
    s = dict(settings)
    if sched == "WarmupCosineLR":
        w, t = s["warmup_steps"], s["total_steps"]
        return opt, L.SequentialLR(opt, [
            L.LinearLR(opt, start_factor=s["warmup_start_factor"], end_factor=1.0, total_iters=w),
            L.CosineAnnealingLR(opt, T_max=t - w, eta_min=s["eta_min"])], milestones=[w])
    if sched == "ChainedScheduler":
        return opt, L.ChainedScheduler([
            L.LinearLR(opt, start_factor=s["start_factor"], end_factor=s["end_factor"],
                       total_iters=s["total_iters"]),
            L.ExponentialLR(opt, gamma=s["gamma"])])
    if sched == "LambdaLR":
        factor = s["factor"]
        return opt, L.LambdaLR(opt, lambda e: factor ** e)
    return opt, getattr(L, sched)(opt, **s)


def momenta(opt):
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]


def hexes(values):
    return " ".join(float.hex(float(v)) for v in values)


def word(v):
    if isinstance(v, list):
        return f"{len(v)} " + " ".join(word(x) for x in v)
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return float.hex(v)
    return str(v)


def listed(key, value):
    """max_lr, milestones and min_lr go to the fixture as lists, a lone value as a list of one."""
    lists = ("max_lr", "milestones", "min_lr")
    return [value] if key in lists and not isinstance(value, list) else value


def plain(state):
    """Python's state dict with a Counter as a plain dict (C++'s unpickler has no Counter)."""
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            v = dict(v)
        elif isinstance(v, list):
            v = [plain(x) if isinstance(x, dict) else x for x in v]
        out[k] = v
    return out


def mask_of(n):
    rnd = random.Random(1234 + n)
    return [0 if rnd.random() < 0.2 else 1 for _ in range(STEPS)]


def metrics_of(n, settings):
    """A validation metric per step that improves in jumps, with noise (ReduceLROnPlateau)."""
    rnd = random.Random(4321 + n)
    sign = -1.0 if settings.get("mode") == "max" else 1.0
    return [sign * (1.0 / (1 + i // 9) + 0.02 * rnd.random()) for i in range(STEPS)]


def run(case, n, upto=STEPS, start=0, sched=None, opt=None):
    name, opt_name, kind, settings = case
    if sched is None:
        opt, sched = make(opt_name, kind, settings)
    mask, metrics = mask_of(n), metrics_of(n, settings)
    rows, state = [], None
    for i in range(start, upto):
        if mask[i] and kind == "ReduceLROnPlateau":
            sched.step(metrics[i])
        elif mask[i]:
            sched.step()
        rows.append(([g["lr"] for g in opt.param_groups], momenta(opt)))
        if i + 1 == RESUME:
            state = sched.state_dict()
    return opt, sched, rows, state


def write(path):
    warnings.simplefilter("ignore")
    out = ["loom-lr-scheduler-parity 1", f"cases {len(CASES)} steps {STEPS} resume {RESUME}",
           f"lrs {hexes(LRS)}"]
    for n, case in enumerate(CASES):
        name, opt_name, kind, settings = case
        opt, _ = make(opt_name, kind, settings)
        out.append(f"case {name} {opt_name} {kind} {len(settings)} " +
                   " ".join(f"{k} {word(listed(k, v))}" for k, v in settings.items()))
        out.append("initial " + hexes([g["lr"] for g in opt.param_groups]) + " " +
                   hexes(momenta(opt)))
        _, _, rows, state = run(case, n)
        out.append("mask " + " ".join(map(str, mask_of(n))))
        out.append("metrics " + hexes(metrics_of(n, settings)))
        for lrs, ms in rows:
            out.append("row " + hexes(lrs) + " " + hexes(ms))
        torch.save(plain(state), f"{path}.{name}.py.pt")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def same(a, b, where):
    if type(a) is not type(b) and not (isinstance(a, dict) and isinstance(b, dict)):
        raise AssertionError(f"{where}: {type(a).__name__} {a!r} vs Python's "
                             f"{type(b).__name__} {b!r}")
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            raise AssertionError(f"{where}: keys {list(a.keys())} vs Python's {list(b.keys())}")
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        if len(a) != len(b):
            raise AssertionError(f"{where}: {len(a)} items vs Python's {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif a != b:
        raise AssertionError(f"{where}: {a!r} vs Python's {b!r}")


def check(path):
    warnings.simplefilter("ignore")
    torch.serialization.add_safe_globals([jp.restore_type_tag, jp.build_intlist,
                                          jp.build_doublelist, jp.build_boollist,
                                          jp.build_tensorlist])
    for n, case in enumerate(CASES):
        name, opt_name, kind, settings = case
        loom_state = torch.load(f"{path}.{name}.cpp.pt")
        _, _, rows, py_state = run(case, n)
        same(loom_state, plain(py_state), name)
        # Resume in Python from loom's state: the optimizer's lrs as they were then.
        opt, sched = make(opt_name, kind, settings)
        sched.load_state_dict(loom_state)
        for g, lr, m in zip(opt.param_groups, *rows[RESUME - 1]):
            g["lr"] = lr
            if "betas" in g:
                g["betas"] = (m, g["betas"][1])
            else:
                g["momentum"] = m
        _, _, resumed, _ = run(case, n, start=RESUME, sched=sched, opt=opt)
        if resumed != rows[RESUME:]:
            raise AssertionError(f"{name}: Python resumed from loom's state gives other lrs")
        print(f"{name}: loom's state has Python's {len(loom_state)} keys and values; "
              f"resumed {STEPS - RESUME} steps equal")


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        write(sys.argv[1])
