"""Training that crosses between Python and loom through checkpoints, bitwise
(tests/unit/checkpoint/training_test.cpp, ctest checkpoint.training).

  python checkpoint_training.py BASE            Python trains, writes BASE.CASE.{init,k,final}.pt
  python checkpoint_training.py --check BASE    Python resumes loom's BASE.CASE.loom_k.pt

Each case is a small model (Linear, BatchNorm1d, ReLU, Linear; a BatchNorm buffer is an int64)
with an optimizer over two param groups, trained STEPS steps on fixed data. Python writes the
initial weights, a Fabric-style checkpoint after K steps ({"model": state_dict(), "optimizer":
optimizer.state_dict(), "step": K}) and the state after STEPS steps. loom (the C++ test) starts
from the same weights and must reach Python's final state bitwise; it resumes Python's
K-step checkpoint and must reach it again; it writes its own K-step checkpoint, which --check
loads here with stock torch.load into torch.optim and resumes: the final state must equal loom's.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
from same_state import same  # noqa: E402

STEPS, K = 10, 4
# name, Python optimizer, group 0 options, group 1 options (each as Python's constructor takes)
CASES = [
    ("sgd", "SGD", dict(lr=0.05, momentum=0.9, fused=True),
     dict(lr=0.02, momentum=0.8, weight_decay=1e-3, fused=True)),
    ("adam", "Adam", dict(lr=1e-2, fused=True), dict(lr=5e-3, amsgrad=True, fused=True)),
    ("adamw", "AdamW", dict(lr=1e-2, fused=True), dict(lr=5e-3, weight_decay=0.1, fused=True)),
    # LibTorch's torch::optim::SGD: Python's for-loop SGD is the same arithmetic.
    ("torch_sgd", "SGD", dict(lr=0.05, momentum=0.9, foreach=False),
     dict(lr=0.02, momentum=0.9, foreach=False)),
]


def model():
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3))


def optimizer(m, kind, g0, g1):
    groups = [dict(params=list(m[0].parameters()) + list(m[1].parameters()), **g0),
              dict(params=list(m[3].parameters()), **g1)]
    return getattr(torch.optim, kind)(groups)


def batch(i):
    x = torch.arange(48, dtype=torch.float32).reshape(8, 6).sin() * (i + 1)
    return x, torch.arange(8) % 3


def train(m, opt, first, last):
    for i in range(first, last):
        x, y = batch(i)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def write(base):
    for name, kind, g0, g1 in CASES:
        torch.manual_seed(0)
        m = model()
        opt = optimizer(m, kind, g0, g1)
        torch.save(m.state_dict(), f"{base}.{name}.init.pt")
        train(m, opt, 0, K)
        torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "step": K},
                   f"{base}.{name}.k.pt")
        train(m, opt, K, STEPS)
        torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()},
                   f"{base}.{name}.final.pt")
    print(f"wrote {len(CASES)} cases to {base}.*.pt")


def check(base):
    for name, kind, g0, g1 in CASES:
        ck = torch.load(f"{base}.{name}.loom_k.pt")  # stock torch.load: weights_only=True
        final = torch.load(f"{base}.{name}.loom_final.pt")
        if ck["step"] != K:
            raise AssertionError(f"{name}: loom's checkpoint is at step {ck['step']!r}, want {K}")
        if ck["runtime"]["precision"] != "32-true":
            raise AssertionError(f"{name}: loom's checkpoint has precision "
                                 f"{ck['runtime']['precision']!r}, want '32-true'")
        torch.set_rng_state(ck["runtime"]["device"][0]["torch"])  # the CPU generator, as saved
        m = model()
        m.load_state_dict(ck["model"])
        # Other options on purpose: load_state_dict replaces them with the checkpoint's.
        opt = optimizer(m, kind, dict(lr=1.0), dict(lr=1.0))
        opt.load_state_dict(ck["optimizer"])
        for group, want in zip(opt.param_groups, (g0, g1)):
            for key, value in want.items():  # (LibTorch's optimizers write foreach=None)
                if key != "foreach" and group[key] != value:
                    raise AssertionError(f"{name}: the loaded group's {key} is {group[key]!r}, "
                                         f"loom saved it as {value!r}")
        train(m, opt, K, STEPS)
        same(final["model"], m.state_dict(), f"{name}.model")
        same(final["optimizer"]["state"], opt.state_dict()["state"], f"{name}.optimizer.state")
        print(f"{name}: Python resumed loom's step-{K} checkpoint; {STEPS} steps equal loom's bitwise")


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        write(sys.argv[1])
