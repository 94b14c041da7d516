"""Seeds of loom's DCP metadata fuzzer (tests/fuzz/dcp_fuzz.cpp): the `.metadata` files Python's
torch.distributed.checkpoint writes (one process, no process group): a model's state dict; a
model and its AdamW state through get_state_dict (flattened: planner_data, names as optimizer
keys, objects such as the learning rate); tensors of several dtypes and a scalar.

Usage: python make_dcp_seeds.py DIR
"""

import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore")  # DCP warns that no process group is initialized
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    states = {"model": {"model": model.state_dict()},
              "model_optimizer": {"model": msd, "optimizer": osd},
              "dtypes": {"f64": torch.ones(2, dtype=torch.float64),
                         "bf16": torch.ones(3, 2, dtype=torch.bfloat16),
                         "i64": torch.arange(5), "scalar": torch.tensor(1.5), "n": 7}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, state in states.items():
            d = Path(tmp) / name
            dcp.save(state, checkpoint_id=str(d))
            shutil.copy(d / ".metadata", out / f"{name}.metadata")
    print(f"{len(list(out.iterdir()))} DCP metadata seeds in {out}")


if __name__ == "__main__":
    main()
