"""Writes the fixture of loom's fused-optimizer parity test (tests/unit/optim/optim_parity_test.cpp).

Runs torch.optim.SGD, Adam and AdamW with fused=True over two param groups with their own
options, for STEPS steps of fixed random gradients (one parameter has no gradient on some
steps), in f32 and in bf16, and writes the resolved options of every group, the initial
parameters, every gradient, and the final parameters and per-parameter state. Every state
tensor is written with its own dtype and shape (Python's, so the C++ side compares loom's
against them rather than assuming its own). Every number is written exactly (float.hex; bf16
values widen to f32 exactly), so the C++ side compares bitwise.

Usage: python optim_parity.py OUTPUT_FILE [DEVICE]      (DEVICE: cpu, the default, or cuda)
"""

import os
import sys

import torch

STEPS = 50
NO_GRAD = {3: 2, 17: 0, 30: 2}  # step -> parameter without a gradient on that step
SHAPES = [(4, 3), (3,), (5,)]   # params 0 and 1 in group 0, param 2 in group 1
F32, BF16 = torch.float32, torch.bfloat16

# name, optimizer, dtype, (group 0 options, group 1 options): what a group leaves out is the
# optimizer's default, as Python resolves it.
CASES = [
    ("sgd", "SGD", F32, (dict(lr=0.05), dict(lr=0.02, weight_decay=0.01))),
    ("sgd_momentum", "SGD", F32,
     (dict(lr=0.05, momentum=0.9), dict(lr=0.02, momentum=0.8, dampening=0.1, weight_decay=1e-3))),
    ("sgd_nesterov_maximize", "SGD", F32,
     (dict(lr=0.05, momentum=0.9, nesterov=True), dict(lr=0.02, momentum=0.9, maximize=True))),
    ("adam", "Adam", F32,
     (dict(lr=1e-2), dict(lr=5e-3, betas=(0.8, 0.99), weight_decay=1e-2, eps=1e-6))),
    ("adam_amsgrad", "Adam", F32,
     (dict(lr=1e-2, amsgrad=True), dict(lr=5e-3, amsgrad=True, maximize=True))),
    ("adamw", "AdamW", F32, (dict(lr=1e-2), dict(lr=5e-3, weight_decay=0.1))),
    ("adamw_amsgrad", "AdamW", F32,
     (dict(lr=1e-2, amsgrad=True), dict(lr=5e-3, amsgrad=True, weight_decay=0.05))),
    ("sgd_momentum_bf16", "SGD", BF16, (dict(lr=0.05, momentum=0.9), dict(lr=0.02))),
    ("adam_bf16", "Adam", BF16, (dict(lr=1e-2), dict(lr=5e-3, amsgrad=True))),
    ("adamw_bf16", "AdamW", BF16, (dict(lr=1e-2), dict(lr=5e-3, weight_decay=0.1))),
]
KEYS = {
    "SGD": ["lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"],
    "Adam": ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"],
}
KEYS["AdamW"] = KEYS["Adam"]
STATE = {"SGD": ["momentum_buffer"],
         "Adam": ["step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"]}
STATE["AdamW"] = STATE["Adam"]


def hexes(t):
    return " ".join(float.hex(float(v)) for v in t.detach().float().reshape(-1).tolist())


def dtype_name(t):
    """float32, bfloat16, ...: the name the C++ side compares loom's state dtype with."""
    return str(t.dtype).removeprefix("torch.")


def option(value):
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return " ".join(float.hex(float(v)) for v in value)
    return float.hex(float(value))


def main():
    device = torch.device(sys.argv[2] if len(sys.argv) > 2 else "cpu")
    out = ["loom-optim-parity 2", f"device {device.type}", f"cases {len(CASES)}"]
    for n, (name, opt_name, dtype, groups) in enumerate(CASES):
        gen = torch.Generator().manual_seed(1000 + n)
        params = [torch.randn(s, generator=gen).to(device, dtype).requires_grad_()
                  for s in SHAPES]
        out.append(f"case {name} {opt_name} {'bf16' if dtype is BF16 else 'f32'}")
        for i, p in enumerate(params):
            out.append(f"param {i} {p.dim()} {' '.join(map(str, p.shape))} {hexes(p)}")
        cls = getattr(torch.optim, opt_name)
        opt = cls([{"params": params[:2], **groups[0]}, {"params": params[2:], **groups[1]}],
                  fused=True)
        for g, group in enumerate(opt.param_groups):
            out.append(f"group {g} " + " ".join(f"{k} {option(group[k])}" for k in KEYS[opt_name]))
        out.append(f"steps {STEPS}")
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            for i, p in enumerate(params):
                g = torch.randn(p.shape, generator=gen).to(device, dtype)
                if NO_GRAD.get(step) == i:
                    out.append(f"grad {step} {i} none")
                else:
                    p.grad = g
                    out.append(f"grad {step} {i} {hexes(g)}")
            opt.step()
        for i, p in enumerate(params):
            out.append(f"final {i} {hexes(p)}")
            st = opt.state[p]
            for key in STATE[opt_name]:
                if key in st:
                    t = st[key]  # dtype ndim shape... values: Python's own, not loom's
                    words = ["state", i, key, dtype_name(t), t.dim(), *t.shape, hexes(t)]
                    out.append(" ".join(map(str, words)))
                else:
                    out.append(f"state {i} {key} none")
        out.append("end")
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"optim_parity: {len(CASES)} cases of {STEPS} steps on {device.type} written to "
          f"{sys.argv[1]}")


if __name__ == "__main__":
    main()
