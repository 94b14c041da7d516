"""Seeds of loom's checkpoint fuzzer (tests/fuzz/checkpoint_fuzz.cpp): real torch.save files
of the kinds loom reads (a module's state_dict, optimizer and GradScaler states, a
Fabric-style checkpoint, every dtype, views, protocols 2 and 4), each also as its bare pickle
(data.pkl) for the fuzzer's pickle mode.

Usage: python make_seeds.py DIR
"""

import collections
import io
import sys
import zipfile
from pathlib import Path

import torch


def values():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    sgd = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(m.parameters(), lr=1e-3, fused=True)
    m(torch.randn(5, 3)).sum().backward()
    sgd.step()
    adam.step()
    base = torch.arange(6, dtype=torch.float32).view(2, 3)
    return {
        "state_dict": m.state_dict(),
        "sgd": sgd.state_dict(),
        "adam": adam.state_dict(),
        "scaler": torch.amp.GradScaler("cpu").state_dict(),
        "fabric": {"model": m.state_dict(), "optimizer": adam.state_dict(), "step": 7,
                   "name": "run", "lr": 1e-3, "counts": collections.Counter("aab"),
                   "shape": torch.Size([2, 3]), "tags": {1, 2}},
        "dtypes": {str(d): torch.arange(4).to(d) for d in
                   (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
                    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
                    torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16)},
        "views": {"base": base, "row": base[1], "t": base.t(), "big": 2 ** 40, "neg": -2 ** 40},
        "rng": torch.get_rng_state(),
    }


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for name, value in values().items():
        for protocol in (2, 4):
            buf = io.BytesIO()
            torch.save(value, buf, pickle_protocol=protocol)
            data = buf.getvalue()
            (out / f"{name}.p{protocol}.pt").write_bytes(data)
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                pkl = next(i for i in z.namelist() if i.endswith("/data.pkl"))
                (out / f"{name}.p{protocol}.pkl").write_bytes(z.read(pkl))
            n += 2
    print(f"make_seeds: {n} seeds in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
