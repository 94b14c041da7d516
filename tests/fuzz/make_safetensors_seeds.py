"""Seeds of loom's safetensors fuzzer (tests/fuzz/safetensors_fuzz.cpp): small files written by
Hugging Face's safetensors (the pinned parity peer) of every dtype its torch layer maps, with
and without metadata, one empty, one of a scalar.

Usage: python make_safetensors_seeds.py DIR
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    f = torch.arange(6, dtype=torch.float32).view(2, 3) / 7
    dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
              torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64]
    for i, dt in enumerate(dtypes):
        save_file({"t": f.to(dt)}, str(out / f"dtype_{i}.safetensors"))
    save_file({"a": f, "b": torch.arange(3), "c": torch.tensor(2.0)}, str(out / "mixed.safetensors"),
              metadata={"format": "pt", "k": "v"})
    save_file({}, str(out / "empty.safetensors"))
    save_file({"z": torch.empty(0, 4)}, str(out / "zero.safetensors"))
    print(f"{len(list(out.iterdir()))} safetensors seeds in {out}")


if __name__ == "__main__":
    sys.exit(main())
