"""Writes the fixture of loom's clipping parity test (tests/unit/optim/clip_grad_parity_test.cpp).

Runs torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite,
foreach=True) itself over fixed random gradients: several parameters of different sizes (one
of 4099 elements, to reach the vectorized loops' tails) in two param groups, in float32,
bfloat16, float16 and a mix of the three; norm types 2, inf, 1 and 3; max_norm values that clip
and values that do not; parameters without a gradient, all-zero and absent gradients; nan and inf
gradients, with error_if_nonfinite off (the norm is nan or inf and the gradients are scaled by
it) and on (Python raises before it scales anything; loom raises after scaling, as documented
in docs/precision.md, so for these cases the fixture records "raises" and then what the call
without the check returns and leaves, which loom's gradients must equal).

For each case it writes the inputs (options, each parameter's dtype and shape, each gradient),
then what Python returned: the total norm (after "raises" for the cases that raise) and every
gradient after the call. Each tensor is written as its dtype, its shape and the raw bits of its
elements in hex (nan payloads and signs included), so the C++ side compares bit for bit.

Usage: python clip_grad_parity.py OUTPUT_FILE
"""

import math
import os
import sys

import torch

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
INF = math.inf
SHAPES = [(7, 5), (13,), (3, 4, 2), (1,), (4099,)]
MIXED = [F32, BF16, F16, F32, BF16]
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# name, dtype of each parameter, norm_type, max_norm, error_if_nonfinite, gradient scale,
# and what is special: "no_grad" (parameters 1 and 3 have none), "zero" (all gradients zero),
# "none" (no gradient at all), "nan" or "inf" (one element of parameter 2's gradient).
# The sizes above give f32/bf16/f16 2-norms near 65 * scale; max_norm 0.5 clips, 1e4 does not.
CASES = [
    ("f32_l2_clip", [F32] * 5, 2.0, 0.5, False, 1.0, ""),
    ("f32_l2_noclip", [F32] * 5, 2.0, 1e4, False, 1.0, ""),
    ("f32_l2_clip_small", [F32] * 5, 2.0, 0.25, False, 1e-2, ""),
    ("f32_inf_clip", [F32] * 5, INF, 0.3, False, 1.0, ""),
    ("f32_inf_noclip", [F32] * 5, INF, 100.0, False, 1.0, ""),
    ("f32_l1_clip", [F32] * 5, 1.0, 2.0, False, 1.0, ""),
    ("f32_l3_clip", [F32] * 5, 3.0, 0.5, False, 1.0, ""),
    ("f32_l2_error_finite", [F32] * 5, 2.0, 0.5, True, 1.0, ""),
    ("f32_l2_no_grad", [F32] * 5, 2.0, 0.5, False, 1.0, "no_grad"),
    ("f32_l2_zero", [F32] * 5, 2.0, 0.5, False, 1.0, "zero"),
    ("f32_l2_none", [F32] * 5, 2.0, 0.5, False, 1.0, "none"),
    ("bf16_l2_clip", [BF16] * 5, 2.0, 0.5, False, 1.0, ""),
    ("bf16_l2_noclip", [BF16] * 5, 2.0, 1e4, False, 1.0, ""),
    ("bf16_inf_clip", [BF16] * 5, INF, 0.3, False, 1.0, ""),
    ("bf16_l1_clip", [BF16] * 5, 1.0, 2.0, False, 1.0, ""),
    ("f16_l2_clip", [F16] * 5, 2.0, 0.5, False, 1.0, ""),
    ("f16_l2_noclip", [F16] * 5, 2.0, 1e4, False, 1.0, ""),
    ("f16_inf_clip", [F16] * 5, INF, 0.3, False, 1.0, ""),
    ("mixed_l2_clip", MIXED, 2.0, 0.5, False, 1.0, ""),
    ("mixed_l2_noclip", MIXED, 2.0, 1e4, False, 1.0, ""),
    ("mixed_inf_clip", MIXED, INF, 0.3, False, 1.0, ""),
    ("mixed_l1_clip", MIXED, 1.0, 2.0, False, 1.0, ""),
    ("f32_l2_nan", [F32] * 5, 2.0, 0.5, False, 1.0, "nan"),
    ("f32_inf_nan", [F32] * 5, INF, 0.5, False, 1.0, "nan"),
    ("f32_l2_inf", [F32] * 5, 2.0, 0.5, False, 1.0, "inf"),
    ("bf16_l2_inf", [BF16] * 5, 2.0, 0.5, False, 1.0, "inf"),
    ("f32_l2_nan_error", [F32] * 5, 2.0, 0.5, True, 1.0, "nan"),
    ("f32_inf_inf_error", [F32] * 5, INF, 0.5, True, 1.0, "inf"),
]
SPLIT = 2  # parameters [0, SPLIT) in param group 0, the rest in group 1


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def tensor_words(t):
    """dtype ndim shape... bits...: the elements' raw bits in hex, so nothing is lost."""
    t = t.detach().cpu().contiguous()
    bits = t.view(BITS[t.element_size()]).reshape(-1).tolist()
    mask = (1 << (8 * t.element_size())) - 1
    return " ".join([dtype_name(t.dtype), str(t.dim()), *map(str, t.shape),
                     *(format(b & mask, "x") for b in bits)])


def case_lines(n, name, dtypes, norm_type, max_norm, error, scale, special):
    gen = torch.Generator().manual_seed(2000 + n)
    params, grads = [], []
    for i, (shape, dtype) in enumerate(zip(SHAPES, dtypes)):
        p = torch.zeros(shape, dtype=dtype, requires_grad=True)
        g = (torch.randn(shape, generator=gen) * scale).to(dtype)
        if special == "zero":
            g.zero_()
        if special in ("nan", "inf") and i == 2:
            g.view(-1)[5] = math.nan if special == "nan" else -INF
        if special == "none" or (special == "no_grad" and i in (1, 3)):
            g = None
        p.grad = g
        params.append(p)
        grads.append(g)
    lines = [f"case {name}",
             f"options {float.hex(norm_type)} {float.hex(max_norm)} {int(error)}",
             f"params {len(params)} split {SPLIT}"]
    for i, (p, g) in enumerate(zip(params, grads)):
        lines.append(f"param {i} {dtype_name(p.dtype)} {p.dim()} {' '.join(map(str, p.shape))}")
        lines.append(f"grad {i} " + ("none" if g is None else tensor_words(g)))
    result = "result"
    if error and special in ("nan", "inf"):
        # Python raises before it scales anything; loom (docs/precision.md, Clipping) raises
        # after scaling, as Python does with error_if_nonfinite off. So the fixture records
        # that Python raised, then what the same call without the check returns and leaves.
        before = [None if g is None else g.clone() for g in grads]
        try:
            torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite=True,
                                           foreach=True)
        except RuntimeError as e:
            if "non-finite" not in str(e):
                raise
        else:
            raise RuntimeError(f"clip_grad_parity: {name}: Python did not raise")
        for g, b in zip(grads, before):
            if g is not None and not torch.equal(g.view(BITS[g.element_size()]),
                                                 b.view(BITS[b.element_size()])):
                raise RuntimeError(f"clip_grad_parity: {name}: Python scaled before raising")
        result, error = "result raises", False
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite=error,
                                          foreach=True)
    lines.append(f"{result} norm {tensor_words(norm)}")
    if "noclip" in name and not float(norm) < max_norm:
        raise RuntimeError(f"clip_grad_parity: {name}: norm {float(norm)} clips")
    if "_clip" in name and not float(norm) > max_norm:
        raise RuntimeError(f"clip_grad_parity: {name}: norm {float(norm)} does not clip")
    for i, p in enumerate(params):
        lines.append(f"clipped {i} " + ("none" if p.grad is None else tensor_words(p.grad)))
    lines.append("end")
    return lines


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = ["loom-clip-grad-parity 1", f"cases {len(CASES)}"]
    raised = 0
    for n, case in enumerate(CASES):
        lines = case_lines(n, *case)
        raised += any(line.startswith("result raises ") for line in lines)
        out.extend(lines)
    # What the cases are for: a case that stopped clipping, or stopped raising, would test
    # less than its name says.
    if raised != sum(case[4] and case[6] in ("nan", "inf") for case in CASES):
        raise RuntimeError(f"clip_grad_parity: {raised} cases raised, not the non-finite ones")
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"clip_grad_parity: {len(CASES)} cases of torch.nn.utils.clip_grad_norm_"
          f"(foreach=True) written to {sys.argv[1]}")


if __name__ == "__main__":
    main()
