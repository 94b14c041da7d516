"""safetensors both ways between loom and Hugging Face's safetensors (the pinned parity peer).

Python writes a file of every dtype its torch layer maps (odd shapes, a scalar, an empty
tensor, metadata); loom reads it and writes it again (tests/checkpoint/safetensors_tool.cpp),
and Python's load_file reads loom's file back: every tensor must hold the same bits, dtype and
shape, the metadata must be the same, and the file laid out as Python's (the same header, the
same data bytes). Then the sharded layout: loom writes Hugging Face's
(model-0000K-of-0000N.safetensors + model.safetensors.index.json), which Python reads file by
file through the index; Python writes one by hand as transformers does, which loom reads
through its index. Prints "safetensors parity: ok".

Usage: python safetensors_parity.py --tool BIN --dir DIR
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def tensors():
    g = torch.Generator().manual_seed(5)
    f = torch.randn(3, 7, generator=g)
    out = {
        "f64": f.double(), "f32": f, "f16": f.half(), "bf16": f.bfloat16(),
        "i64": torch.arange(-5, 6), "i32": torch.arange(9, dtype=torch.int32),
        "i16": torch.arange(9, dtype=torch.int16), "i8": torch.arange(-4, 5, dtype=torch.int8),
        "u8": torch.arange(250, 256, dtype=torch.uint8), "bool": torch.rand(5, generator=g) > 0.5,
        "f8_e4m3": f.to(torch.float8_e4m3fn), "f8_e5m2": f.to(torch.float8_e5m2),
        "f8_e4m3fnuz": f.to(torch.float8_e4m3fnuz), "f8_e5m2fnuz": f.to(torch.float8_e5m2fnuz),
        "c64": torch.randn(4, dtype=torch.complex64, generator=g),
        "u16": torch.arange(7, dtype=torch.int32).to(torch.uint16),
        "u32": torch.arange(7, dtype=torch.int32).to(torch.uint32),
        "u64": torch.arange(7, dtype=torch.int32).to(torch.uint64),
        "scalar": torch.tensor(1.5), "empty": torch.empty(0, 3),
        "transformer.h.0.attn.c_attn.weight": torch.randn(8, 24, generator=g),
    }
    return out


def same(a, b, what):
    bad = []
    if set(a) != set(b):
        bad.append(f"names differ: {sorted(set(a) ^ set(b))}")
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            bad.append(f"{k}: {x.dtype}{tuple(x.shape)} against {y.dtype}{tuple(y.shape)}")
        elif not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            bad.append(f"{k}: other bits")
    if bad:
        raise SystemExit(f"safetensors parity: {what}: " + "; ".join(bad))
    print(f"safetensors parity: {what}: {len(a)} tensors, the same bits, dtypes and shapes")


def metadata(path):
    with safe_open(str(path), "pt") as f:
        return f.metadata()


def run(tool, *args):
    r = subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=120)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        raise SystemExit(f"safetensors parity: loom_safetensors_tool {args[0]} failed: "
                         f"{r.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    ref = tensors()
    meta = {"format": "pt", "note": "written by Python"}
    py = d / "python.safetensors"
    save_file(ref, str(py), metadata=meta)

    ours = d / "loom.safetensors"
    run(a.tool, "copy", py, ours)
    same(ref, load_file(str(ours)), "Python's file read by loom, written again, read by Python")
    if metadata(ours) != meta:
        raise SystemExit(f"safetensors parity: metadata {metadata(ours)} against {meta}")
    # The same layout: the same header (as JSON: Python's metadata is a hash map, so its order
    # varies from run to run) and the same data bytes.
    theirs, mine = py.read_bytes(), ours.read_bytes()
    nt, nm = (int.from_bytes(x[:8], "little") for x in (theirs, mine))
    if nt != nm or json.loads(theirs[8:8 + nt]) != json.loads(mine[8:8 + nm]) or \
            theirs[8 + nt:] != mine[8 + nm:]:
        raise SystemExit("safetensors parity: loom lays the same tensors out otherwise than Python")
    print(f"safetensors parity: loom's file and Python's have the same header ({nt} bytes, "
          f"the metadata's order aside) and the same {len(theirs) - 8 - nt} data bytes")

    sharded = d / "loom_sharded"
    run(a.tool, "shard", py, sharded, 256)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    got = {}
    for name in files:
        got.update(load_file(str(sharded / name)))
    if set(index["weight_map"]) != set(got) or \
            index["metadata"]["total_size"] != sum(t.numel() * t.element_size()
                                                   for t in ref.values()):
        raise SystemExit("safetensors parity: loom's index does not describe its files")
    same(ref, got, f"loom's sharded layout ({len(files)} files) read by Python through its index")

    hf = d / "python_sharded"
    hf.mkdir(exist_ok=True)
    names = sorted(ref)
    parts = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(parts):
        file = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        save_file({k: ref[k] for k in part}, str(hf / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    (hf / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    back = d / "from_sharded.safetensors"
    run(a.tool, "copy", hf / "model.safetensors.index.json", back)
    same(ref, load_file(str(back)), "Python's sharded layout read by loom through its index")
    print("safetensors parity: ok")


if __name__ == "__main__":
    sys.exit(main())
