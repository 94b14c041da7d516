"""Writes the fixture of loom's GradScaler parity test (tests/unit/amp/grad_scaler_parity_test.cpp).

Drives torch.amp.GradScaler("cpu") and torch.optim.SGD through a fixed sequence of gradients,
some of which hold inf or nan (injected, or from overflow when scaled), and writes the inputs
and what torch did after every step: whether the step was applied, the scale and the growth
tracker; then the final parameters and state_dict. Every number is written exactly
(float.hex), so the C++ side can compare bitwise.

With the second argument `adam-fused` the optimizer is torch.optim.Adam(fused=True) instead:
torch's scaler then takes its fused branch (no host sync; the kernel unscales and skips), which
loom::optim::Adam must follow bit for bit under loom's scaler.

Usage: python grad_scaler_parity.py OUTPUT_FILE [sgd|adam-fused]
"""

import os
import sys

import torch

STEPS = 30
INIT_SCALE = 1000.0  # not a power of two: unscaling rounds, so inv_scale must match
GROWTH_FACTOR = 3.0
BACKOFF_FACTOR = 0.4
GROWTH_INTERVAL = 3
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4
ADAM_LR = 0.01

# (name, shape, dtype): two f32 tensors and one f64, so unscale_ sees two dtype groups.
PARAMS = [("w", (4, 3), torch.float32), ("b", (3,), torch.float32), ("d", (2,), torch.float64)]

# step -> list of (param index, flat index, value) written into the *scaled* gradient.
INJECT = {
    4: [(0, 5, float("inf"))],
    7: [(1, 0, float("nan"))],
    11: [(0, 0, float("-inf")), (1, 2, float("nan"))],
    19: [(2, 1, float("inf"))],  # only the f64 group overflows
    20: [(0, 11, float("nan"))],
    27: [(1, 1, float("inf"))],
}
OVERFLOW = {24: 0}  # step -> param whose true gradient is so large that scaling overflows f32
NO_GRAD = {9: 1, 15: 2, 19: 0}  # step -> param whose gradient is undefined (None)
EXPLICIT_UNSCALE = {5, 12, 13, 22}  # steps that call unscale_ before step


def values(t):
    return " ".join(float.hex(float(v)) for v in t.reshape(-1).tolist())


def dtype_name(dtype):
    return {torch.float32: "f32", torch.float64: "f64"}[dtype]


def main():
    out_path = sys.argv[1]
    optimizer = sys.argv[2] if len(sys.argv) > 2 else "sgd"
    if optimizer not in ("sgd", "adam-fused"):
        raise SystemExit(f"grad_scaler_parity: unknown optimizer {optimizer}")
    gen = torch.Generator().manual_seed(20240917)
    params = [
        torch.randn(shape, generator=gen, dtype=dtype).requires_grad_()
        for _, shape, dtype in PARAMS
    ]
    lines = [
        "loom-grad-scaler-parity 1",
        f"options {float.hex(INIT_SCALE)} {float.hex(GROWTH_FACTOR)} "
        f"{float.hex(BACKOFF_FACTOR)} {GROWTH_INTERVAL}",
        (f"sgd {float.hex(LR)} {float.hex(MOMENTUM)} {float.hex(WEIGHT_DECAY)}"
         if optimizer == "sgd" else f"adam_fused {float.hex(ADAM_LR)}"),
        f"params {len(params)}",
    ]
    for p in params:
        lines.append(f"param {dtype_name(p.dtype)} {p.dim()} {' '.join(map(str, p.shape))} "
                     f"{values(p.detach())}")

    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
                              foreach=False)
    else:
        opt = torch.optim.Adam(params, lr=ADAM_LR, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_factor=GROWTH_FACTOR,
                                  backoff_factor=BACKOFF_FACTOR, growth_interval=GROWTH_INTERVAL)
    lines.append(f"steps {STEPS}")
    skipped = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        grads = []
        for i, p in enumerate(params):
            if NO_GRAD.get(step) == i:
                grads.append(None)
                continue
            magnitude = 1e36 if OVERFLOW.get(step) == i else 10.0 ** ((step % 5) - 2)
            grads.append(torch.randn(p.shape, generator=gen, dtype=p.dtype) * magnitude)
        injections = INJECT.get(step, [])
        lines.append(f"step {step} {int(step in EXPLICIT_UNSCALE)} {len(injections)}")
        for i, g in enumerate(grads):
            lines.append(f"grad {i} " + ("none" if g is None else values(g)))
        for i, index, value in injections:
            lines.append(f"inject {i} {index} {float.hex(value)}")

        for p, g in zip(params, grads):
            if g is None:
                continue
            scaled = scaler.scale(g)  # the true gradient times the scale, as backward would give
            for i, index, value in injections:
                if params[i] is p:
                    scaled.view(-1)[index] = value
            p.grad = scaled
        if step in EXPLICIT_UNSCALE:
            scaler.unscale_(opt)
        scaler.step(opt)
        found = sum(v.item() for v in scaler._per_optimizer_states[id(opt)]
                    ["found_inf_per_device"].values())
        applied = int(found == 0)
        if not applied:
            skipped.append(step)
        scaler.update()
        lines.append(f"expect {applied} {float.hex(scaler.get_scale())} "
                     f"{scaler._get_growth_tracker()}")

    for p in params:
        lines.append(f"final {values(p.detach())}")
    sd = scaler.state_dict()
    lines.append(f"state_dict {float.hex(sd['scale'])} {float.hex(sd['growth_factor'])} "
                 f"{float.hex(sd['backoff_factor'])} {sd['growth_interval']} "
                 f"{sd['_growth_tracker']}")
    lines.append("end")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print(f"grad_scaler_parity: torch {torch.__version__}, {optimizer}, {STEPS} steps, skipped {skipped}, "
          f"final scale {scaler.get_scale()}, tracker {scaler._get_growth_tracker()} -> {out_path}")


if __name__ == "__main__":
    main()
