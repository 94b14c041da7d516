"""Fixture and check of loom's EMA parity test (tests/unit/toolbox/ema_test.cpp).

  python ema_parity.py OUTPUT_FILE        writes the fixture (torch.save)
  python ema_parity.py --check FIXTURE    checks the state loom wrote to FIXTURE.cpp.pt

Writing: a small model with BatchNorm (integer and floating buffers) trains 100 SGD steps; after
every step AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999), use_buffers=True)
averages it. The fixture holds the model's state before the first step and after each step,
and the averaged model's state_dict after 50 and after 100 updates.

Checking: loom wrote its EMA's state_dict after 100 updates; it must have AveragedModel's keys
in its order, tensors of the same dtypes and shapes, bitwise equal to Python's, and a fresh
AveragedModel must load it (strict).
"""

import sys

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

STEPS = 100
DECAY = 0.999


def model():
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(),
                               torch.nn.Linear(5, 2))


def run():
    torch.manual_seed(7)
    m = model()
    ema = AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 6), torch.randn(16, 2)
    states = [{k: v.clone() for k, v in m.state_dict().items()}]
    ema50 = None
    for step in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x + 0.01 * step), y)
        loss.backward()
        opt.step()
        ema.update_parameters(m)
        states.append({k: v.clone() for k, v in m.state_dict().items()})
        if step + 1 == 50:
            ema50 = {k: v.clone() for k, v in ema.state_dict().items()}
    ema100 = {k: v.clone() for k, v in ema.state_dict().items()}
    return states, ema50, ema100


def write(path):
    states, ema50, ema100 = run()
    torch.save({"decay": DECAY, "states": states, "ema50": ema50, "ema100": ema100}, path)


def check(path):
    _, _, ema100 = run()
    loom = torch.load(path + ".cpp.pt")
    if list(loom.keys()) != list(ema100.keys()):
        raise AssertionError(f"keys {list(loom.keys())} vs Python's {list(ema100.keys())}")
    for k, v in ema100.items():
        got = loom[k]
        if got.dtype != v.dtype or got.shape != v.shape or not torch.equal(got, v):
            raise AssertionError(f"{k}: {got} vs Python's {v}")
    fresh = AveragedModel(model(), multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=True)
    fresh.load_state_dict(loom)
    print(f"loom's EMA state: AveragedModel's {len(loom)} keys, bitwise equal after {STEPS} "
          f"updates (n_averaged {int(loom['n_averaged'])}); AveragedModel loads it")


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        write(sys.argv[1])
