"""Files and checks of loom's checkpoint interop test (tests/unit/checkpoint/interop_test.cpp).

  python checkpoint_interop.py BASE            Python writes BASE.*.pt for loom to read
  python checkpoint_interop.py --check BASE    Python reads BASE.loom.pt, which loom wrote

The value both sides build is spec() below (loom's test builds the same in C++): tensors of every
dtype torch.save handles (fp8 and uint16 through _rebuild_tensor_v3), views that share a
storage, a transposed view, ints of every pickle width, floats with inf, nan and -0.0, unicode,
nested tuples, lists and dicts, int keys, devices and a tensor that requires grad. Python writes
it with protocol 2 and 4, a Fabric-style checkpoint (a module's state_dict as an OrderedDict with
_metadata, SGD and Adam state_dicts, a GradScaler state, a Counter, a torch.Size, a Parameter),
and files loom must refuse: a legacy non-zip file and one whose pickle calls os.system.
"""

import collections
import math
import os
import sys
import zipfile

import torch


def spec():
    base = torch.arange(6, dtype=torch.float32).view(2, 3)
    return {
        "f32": base,
        "row": base[1],
        "t": base.t(),
        "f64": torch.arange(3, dtype=torch.float64) / 3,
        "f16": torch.arange(4, dtype=torch.float16) * 0.5,
        "bf16": torch.arange(4, dtype=torch.bfloat16) * 0.25,
        "i64": torch.tensor([-2**40, 0, 2**62], dtype=torch.int64),
        "i32": torch.tensor([-7, 7], dtype=torch.int32),
        "i16": torch.tensor([-300, 300], dtype=torch.int16),
        "i8": torch.tensor([-100, 100], dtype=torch.int8),
        "u8": torch.arange(5, dtype=torch.uint8),
        "bool": torch.tensor([True, False]),
        "c64": torch.tensor([1 + 2j], dtype=torch.complex64),
        "fp8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
        "fp8b": torch.tensor([0.25, 4.0]).to(torch.float8_e5m2),
        "u16": torch.tensor([1, 65535], dtype=torch.uint16),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "grad": torch.ones(2).requires_grad_(),
        "ints": [0, 255, 256, 65535, 65536, -1, -2**31, 2**31 - 1, 2**31, 2**40, -2**40,
                 2**63 - 1, -2**63],
        "floats": [0.0, -0.0, 1.5, 1e300, math.inf, -math.inf],
        "nan": math.nan,
        "str": "h\u00e9llo \u2713",
        "empty_str": "",
        "none": None,
        "true": True,
        "false": False,
        "tuple": (1, "a", (2.5,)),
        "big_tuple": (1, 2, 3, 4, 5),
        "empty_tuple": (),
        "list": [1, [2, [3]]],
        "empty_list": [],
        "empty_dict": {},
        "int_keys": {0: "a", 7: "b"},
        "device": torch.device("cuda", 1),
        "cpu": torch.device("cpu"),
    }


def same(a, b, where):
    """Exact equality, types included; tensors bit for bit with their layout."""
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor):
            raise AssertionError(f"{where}: {type(a).__name__}, not a tensor")
        if a.dtype != b.dtype:
            raise AssertionError(f"{where}: dtype {a.dtype} vs {b.dtype}")
        if a.shape != b.shape or a.stride() != b.stride():
            raise AssertionError(
                f"{where}: shape/stride {a.shape}/{a.stride()} vs {b.shape}/{b.stride()}")
        if a.storage_offset() != b.storage_offset():
            raise AssertionError(
                f"{where}: storage offset {a.storage_offset()} vs {b.storage_offset()}")
        if a.requires_grad != b.requires_grad:
            raise AssertionError(f"{where}: requires_grad {a.requires_grad} vs {b.requires_grad}")
        ab = a.detach().contiguous().reshape(-1).view(torch.uint8) if a.numel() else a
        bb = b.detach().contiguous().reshape(-1).view(torch.uint8) if b.numel() else b
        if a.numel() != 0 and not torch.equal(ab, bb):
            raise AssertionError(f"{where}: values differ: bytes {ab[:16].tolist()}... vs "
                                 f"{bb[:16].tolist()}...")
        return
    if type(a) is not type(b):
        raise AssertionError(f"{where}: {type(a).__name__} {a!r} vs {type(b).__name__} {b!r}")
    if isinstance(b, dict):
        if list(a.keys()) != list(b.keys()):
            raise AssertionError(f"{where}: keys {list(a)} vs {list(b)}")
        for k in b:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"{where}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(b, float) and math.isnan(b):
        if not math.isnan(a):
            raise AssertionError(f"{where}: {a} vs nan")
    elif isinstance(b, float):
        if a != b or math.copysign(1, a) != math.copysign(1, b):
            raise AssertionError(f"{where}: {a} vs {b}")
    elif a != b:
        raise AssertionError(f"{where}: {a!r} vs {b!r}")


class Shell:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def write(base):
    torch.save(spec(), base + ".spec.pt")
    torch.save(spec(), base + ".spec4.pt", pickle_protocol=4)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).view_as(p) + 10 * i)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    for opt in (sgd, adam):
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).view_as(p) + 10 * i)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    torch.save({"model": model.state_dict(), "sgd": sgd.state_dict(), "adam": adam.state_dict(),
                "scaler": scaler.state_dict(), "counter": collections.Counter([5, 5, 2]),
                "size": torch.Size([2, 3]), "param": torch.nn.Parameter(torch.ones(2)),
                "step": 7}, base + ".fabric.pt")
    torch.save(spec()["f32"], base + ".legacy.pt", _use_new_zipfile_serialization=False)
    torch.save({"x": Shell()}, base + ".shell.pt")
    print(f"checkpoint_interop: wrote {base}.{{spec,spec4,fabric,legacy,shell}}.pt")


def check(base):
    got = torch.load(base + ".loom.pt")  # the defaults: weights_only=True, no allowlist
    same(got, spec(), "loom's file")
    for view in ("row", "t"):
        if got[view].untyped_storage().data_ptr() != got["f32"].untyped_storage().data_ptr():
            raise AssertionError(f"{view} and f32 do not share their storage")
    # Python's zipfile checks every record against the CRC-32 of its central directory entry.
    with zipfile.ZipFile(base + ".loom.pt") as z:
        bad = z.testzip()
        if bad is not None:
            raise AssertionError(f"zipfile: the CRC-32 of {bad} in loom's file does not match")
        n = len(z.infolist())
    print(f"checkpoint_interop: torch.load (weights_only=True) read loom's file: "
          f"{len(got)} entries equal, views share their storage; zipfile checked the CRC-32s "
          f"of its {n} records")


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        write(sys.argv[1])
