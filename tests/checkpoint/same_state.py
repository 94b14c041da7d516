"""Bitwise comparison of two checkpoints, opened with stock torch.load.

  python same_state.py A.pt B.pt      prints "same state: ..." and exits 0, or names the first
                                      difference and exits 1

same(a, b, path) is what loom's resume tests compare with: tensors by dtype, shape and bytes
(so nan == nan and -0.0 != 0.0), dicts by keys in order and values, lists and tuples element by
element, everything else by type and ==.

check(cond, what) and test_seed(what) are small helpers the harnesses share: a check that raises
(python -O strips assert statements, not this), and a random seed that is printed and that
LOOM_TEST_SEED fixes.
"""

import os
import sys
import time

import torch


def check(cond, what):
    """Raises AssertionError(what) unless cond: a test check that PYTHONOPTIMIZE keeps."""
    if not cond:
        raise AssertionError(what)


def test_seed(what):
    """The seed of a test's random choices: LOOM_TEST_SEED if set, else the clock. Printed, so
    that a failure can be repeated with LOOM_TEST_SEED=<it>."""
    seed = os.environ.get("LOOM_TEST_SEED") or str(time.time_ns())
    print(f"{what}: seed {seed} (LOOM_TEST_SEED={seed} repeats its random choices)", flush=True)
    return seed


def same(a, b, path):
    """Raises AssertionError naming the first place where a and b differ."""
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))):
            raise AssertionError(f"{path} differs")
    elif isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            raise AssertionError(f"{path}: keys {list(a.keys())} != {list(b.keys())}")
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            raise AssertionError(f"{path}: {a!r} != {b!r}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif type(a) is not type(b) or a != b:
        raise AssertionError(f"{path}: {a!r} != {b!r}")


def count_tensors(v):
    if isinstance(v, torch.Tensor):
        return 1
    if isinstance(v, dict):
        return sum(count_tensors(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return sum(count_tensors(x) for x in v)
    return 0


if __name__ == "__main__":
    a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
    try:
        same(a, b, "checkpoint")
    except AssertionError as e:
        print(f"different: {e}")
        sys.exit(1)
    print(f"same state: {list(a)}, {count_tensors(a)} tensors bitwise equal")
