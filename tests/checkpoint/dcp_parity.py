"""loom reads and writes torch.distributed.checkpoint (DCP) directories.

Python (one process, no process group) writes with dcp.save: a model with its AdamW state
through get_state_dict (flattened: the optimizer keyed by parameter names, its hyperparameters
as objects), tensors of several dtypes (bf16, f64, int64, a scalar, an empty one), a nested
dict and a list, and Python objects (int, float, str, tuple, None). loom_dcp_tool reads each
directory with loom::checkpoint::dcp::load and writes one torch.save file, which Python's
torch.load(weights_only=True) opens: the same nesting, the same bits, and the optimizer state
keyed by ids as opt.state_dict() keys it. The other way, loom writes each state as a DCP
directory (loom_dcp_tool from-torch, loom::checkpoint::dcp::save): Python's dcp_to_torch_save
gives back the same values bitwise, and dcp.load + set_state_dict read the model and its
optimizer into a fresh model. Then the refusals: a truncated .distcp file, a
missing one, an unknown global in .metadata (a pickle that would run code), each a message
naming what is wrong.

Usage: python dcp_parity.py --tool BIN --dir DIR
"""

import argparse
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict


def same(a, b, path="state"):
    """'' when a and b (nested dicts, lists, tuples, tensors, scalars) are the same, bitwise."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{tuple(a.shape)} against {b!r}"
        if a.numel() and not torch.equal(a.reshape(-1).view(torch.uint8),
                                         b.reshape(-1).view(torch.uint8)):
            return f"{path}: the bits differ"
        return ""
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return f"{path}: keys {sorted(map(str, a))} against {b if not isinstance(b, dict) else sorted(map(str, b))}"
        for k in a:
            why = same(a[k], b[k], f"{path}.{k}")
            if why:
                return why
        return ""
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return f"{path}: {a!r} against {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            why = same(x, y, f"{path}[{i}]")
            if why:
                return why
        return ""
    return "" if a == b and type(a) is type(b) else f"{path}: {a!r} against {b!r}"


def tool(args, binary):
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    warnings.filterwarnings("ignore")  # DCP warns that no process group is initialized

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5),
                                torch.nn.Linear(5, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    for _ in range(2):
        model(torch.randn(4, 6)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    cases = {
        "model_optimizer": ({"model": msd, "optimizer": osd},
                            {"model": model.state_dict(), "optimizer": opt.state_dict()}),
        "values": ({"t": {"bf16": torch.randn(3, 4).bfloat16(),
                          "f64": torch.randn(5, dtype=torch.float64),
                          "i64": torch.arange(7), "scalar": torch.tensor(2.5),
                          "empty": torch.empty(0, 3)},
                    "nested": {"a": {"b": torch.ones(2)}, "list": [torch.zeros(2), 3]},
                    "n": 7, "x": 0.25, "s": "text", "pair": (1, 2), "none": None}, None),
    }
    for name, (state, expected) in cases.items():
        out = d / name
        dcp.save(state, checkpoint_id=str(out))
        r = tool(["to-torch", str(out), str(d / f"{name}.pt")], a.tool)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            raise SystemExit(f"dcp parity: loom could not read {name}")
        got = torch.load(d / f"{name}.pt", weights_only=True)
        why = same(expected if expected is not None else state, got)
        print(f"dcp parity: {name}: {r.stdout.strip()}; "
              f"{'the same values, bitwise' if not why else 'DIFFERENT: ' + why}")
        if why:
            raise SystemExit(f"dcp parity: {name}: {why}")

    # The other way: loom writes each state as a DCP directory (loom_dcp_tool from-torch: the
    # torch.save file read by loom and written by loom::checkpoint::dcp::save); Python's
    # dcp_to_torch_save makes one file of it, with the same nesting and bits, and dcp.load
    # reads the model and optimizer into a fresh model through set_state_dict.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import set_state_dict
    for name, (state, expected) in cases.items():
        torch.save(state, d / f"{name}.source.pt")
        out = d / f"{name}.loom"
        r = tool(["from-torch", str(d / f"{name}.source.pt"), str(out)], a.tool)
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            raise SystemExit(f"dcp parity: loom could not write {name}")
        dcp_to_torch_save(str(out), str(d / f"{name}.loom.pt"))
        why = same(state, torch.load(d / f"{name}.loom.pt", weights_only=False))
        files = sorted(p.name for p in out.iterdir())
        print(f"dcp parity: {name}: {r.stdout.strip()} ({', '.join(files)}); Python's "
              f"dcp_to_torch_save: {'the same values, bitwise' if not why else 'DIFFERENT: ' + why}")
        if why or files != [".metadata", "__0_0.distcp"]:
            raise SystemExit(f"dcp parity: {name} written by loom: {why or files}")
    fresh = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5),
                                torch.nn.Linear(5, 3))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1.0)
    fmsd, fosd = get_state_dict(fresh, fresh_opt)
    template = {"model": fmsd, "optimizer": fosd}
    dcp.load(template, checkpoint_id=str(d / "model_optimizer.loom"))
    set_state_dict(fresh, fresh_opt, model_state_dict=template["model"],
                   optim_state_dict=template["optimizer"])
    why = same({"model": model.state_dict(), "optimizer": opt.state_dict()},
               {"model": fresh.state_dict(), "optimizer": fresh_opt.state_dict()})
    print("dcp parity: Python's dcp.load + set_state_dict of loom's directory into a fresh "
          f"model and AdamW: {'the same state, bitwise' if not why else 'DIFFERENT: ' + why}")
    if why:
        raise SystemExit(f"dcp parity: dcp.load of loom's directory: {why}")

    # Refusals, each named.
    src = d / "model_optimizer"
    bad = d / "truncated"
    shutil.copytree(src, bad)
    distcp = bad / "__0_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:-100])
    missing = d / "missing"
    shutil.copytree(src, missing)
    (missing / "__0_0.distcp").unlink()
    hostile = d / "hostile"
    shutil.copytree(src, hostile)

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("echo pwned",))

    meta = pickle.loads((src / ".metadata").read_bytes())
    meta.planner_data = {"x": Evil()}
    (hostile / ".metadata").write_bytes(pickle.dumps(meta))
    for what, path, expect in (("a truncated .distcp file", bad, "truncated"),
                               ("a missing .distcp file", missing, "is missing"),
                               ("an unknown global", hostile, "names the global")):
        r = tool(["to-torch", str(path), str(d / "refused.pt")], a.tool)
        if r.returncode != 1 or expect not in r.stdout or "pwned" in r.stdout:
            print(r.stdout, r.stderr)
            raise SystemExit(f"dcp parity: {what} was not refused with '{expect}'")
        print(f"dcp parity: {what} refused: {r.stdout.strip()}")
    print("dcp parity: ok")


if __name__ == "__main__":
    sys.exit(main())
