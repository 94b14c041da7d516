"""Starts the processes of the parity tests (ddp_parity.py, zero_parity.py, fsdp_parity.py)
under torchrun, and loads their initial parameters."""

import os
import subprocess
import sys
from pathlib import Path


def torchrun(cmd, nproc, what, attempts=1, test="dist"):
    """Runs `cmd` under `torchrun --standalone` with `nproc` workers (0: `cmd` alone), one
    thread each and no rank variables inherited, and returns its standard output. A failure
    prints the end of its output and runs it again, `attempts` times in all; the last one
    ends the test with "TEST: WHAT failed with exit N"."""
    exe = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if nproc > 0:
        cmd = [str(exe), "--standalone", f"--nproc-per-node={nproc}", *cmd]
    for attempt in range(1, attempts + 1):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            return r.stdout
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        if attempt < attempts:
            print(f"{test}: {what} failed with exit {r.returncode} "
                  f"(attempt {attempt} of {attempts}); running it again")
    raise SystemExit(f"{test}: {what} failed with exit {r.returncode}")


def load_flat(model, path):
    """Copies `path` (every parameter of `model` in its order, flat little-endian f32, as the
    parity drivers write init.bin) into `model`'s parameters; returns `model`."""
    import numpy as np
    import torch

    flat = torch.from_numpy(np.fromfile(path, dtype="<f4"))
    with torch.no_grad():
        at = 0
        for p in model.parameters():
            p.copy_(flat[at:at + p.numel()].reshape(p.shape))
            at += p.numel()
    return model


def ranks(d, tag, world):
    """Each rank's flat f32 parameters the workers wrote, DIR/TAG_rankR.bin."""
    import numpy as np

    return [np.fromfile(d / f"{tag}_rank{r}.bin", dtype="<f4") for r in range(world)]


def bitwise(a, b):
    """Whether two lists of f32 arrays hold the same bits."""
    import numpy as np

    return all(np.array_equal(x.view("<u4"), y.view("<u4")) for x, y in zip(a, b))


def maxdiff(a, b):
    """The largest absolute difference between two lists of arrays."""
    import numpy as np

    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))
