"""The Python side of examples/11_finetune: a small GPT-2-style model in Hugging Face's layout
(the names of GPT2LMHeadModel's state dict: transformer.wte.weight, transformer.h.0.attn.
c_attn.weight, ...; Conv1D weights stored [in, out]; the head tied to the token embedding, so
the file has no lm_head.weight), written by safetensors and read back.

  python gpt.py make DIR [--layers 2 --heads 4 --width 64 --context 64 --seed 0]
      DIR/model.safetensors (random weights, GPT-2's initialization) and DIR/config.json
  python gpt.py check DIR/model.safetensors DIR/finetuned.safetensors --text FILE
                 --before LOSS --after LOSS
      reads both files with safetensors, checks the fine-tuned one has the same names, dtypes
      and shapes and other values, and computes the validation loss of each with the forward
      below (the example's 8 windows of the text's last tenth): each must equal what the C++
      program printed (--before, --after) within 1e-4, and the fine-tuned one be lower.
  python gpt.py test DIR --program FINETUNE --text FILE [--steps 150]
      both of the above around one run of the C++ program (its ctest, example.finetune)
"""

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def make(d, layers, heads, width, context, seed):
    g = torch.Generator().manual_seed(seed)
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=g) * std  # noqa: E731
    w = {"transformer.wte.weight": normal(256, width),
         "transformer.wpe.weight": normal(context, width, std=0.01)}
    proj = 0.02 / math.sqrt(2 * layers)  # GPT-2 scales the residual projections
    for i in range(layers):
        p = f"transformer.h.{i}."
        w |= {p + "ln_1.weight": torch.ones(width), p + "ln_1.bias": torch.zeros(width),
              p + "attn.c_attn.weight": normal(width, 3 * width),
              p + "attn.c_attn.bias": torch.zeros(3 * width),
              p + "attn.c_proj.weight": normal(width, width, std=proj),
              p + "attn.c_proj.bias": torch.zeros(width),
              p + "ln_2.weight": torch.ones(width), p + "ln_2.bias": torch.zeros(width),
              p + "mlp.c_fc.weight": normal(width, 4 * width),
              p + "mlp.c_fc.bias": torch.zeros(4 * width),
              p + "mlp.c_proj.weight": normal(4 * width, width, std=proj),
              p + "mlp.c_proj.bias": torch.zeros(width)}
    w |= {"transformer.ln_f.weight": torch.ones(width), "transformer.ln_f.bias": torch.zeros(width)}
    d.mkdir(parents=True, exist_ok=True)
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": 256, "n_positions": context, "n_embd": width,
         "n_layer": layers, "n_head": heads, "layer_norm_epsilon": 1e-5,
         "activation_function": "gelu_new", "tie_word_embeddings": True}, indent=2))
    print(f"gpt.py: wrote {len(w)} tensors "
          f"({sum(t.numel() for t in w.values())} parameters) to {d / 'model.safetensors'}")


def forward(w, ids, heads):
    """GPT2LMHeadModel's forward (no dropout) on (B, T) byte ids: logits (B, T, 256)."""
    def ln(x, p):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], w[p + ".weight"], w[p + ".bias"],
                                              1e-5)

    def conv1d(x, p):
        return torch.addmm(w[p + ".bias"], x.reshape(-1, x.shape[-1]), w[p + ".weight"]).view(
            *x.shape[:-1], -1)

    b, t = ids.shape
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][torch.arange(t)]
    i = 0
    while f"transformer.h.{i}.ln_1.weight" in w:
        p = f"transformer.h.{i}."
        c = x.shape[-1]
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(c, dim=2)
        q, k, v = (u.view(b, t, heads, c // heads).transpose(1, 2) for u in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + conv1d(y.transpose(1, 2).reshape(b, t, c), p + "attn.c_proj")
        h = torch.nn.functional.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(h, p + "mlp.c_proj")
        i += 1
    return ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].t()


def validation_loss(w, text, heads, context):
    data = torch.tensor(list(text), dtype=torch.long)
    val = data[len(data) * 9 // 10:]
    starts = [i * (len(val) - context - 1) // 8 for i in range(8)]
    x = torch.stack([val[s:s + context] for s in starts])
    y = torch.stack([val[s + 1:s + context + 1] for s in starts])
    with torch.no_grad():
        logits = forward(w, x, heads)
        return float(torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)))


def check(pretrained, finetuned, text_file, before, after):
    config = json.loads((Path(pretrained).parent / "config.json").read_text())
    a, b = load_file(pretrained), load_file(finetuned)
    if set(a) != set(b):
        raise SystemExit(f"gpt.py: the names differ: {sorted(set(a) ^ set(b))}")
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape:
            raise SystemExit(f"gpt.py: {k}: {a[k].dtype}{tuple(a[k].shape)} became "
                             f"{b[k].dtype}{tuple(b[k].shape)}")
    changed = sum(not torch.equal(a[k], b[k]) for k in a)
    text = Path(text_file).read_bytes()
    heads, context = config["n_head"], config["n_positions"]
    py_before = validation_loss(a, text, heads, context)
    py_after = validation_loss(b, text, heads, context)
    print(f"gpt.py: safetensors read {len(b)} tensors of the fine-tuned model, the same names, "
          f"dtypes and shapes as the pretrained one, {changed} changed; validation loss in "
          f"Python {py_before:.6f} -> {py_after:.6f} (loom printed {before:.6f} -> {after:.6f})")
    if abs(py_before - before) > 1e-4 or abs(py_after - after) > 1e-4:
        raise SystemExit("gpt.py: Python's forward of the files does not give loom's losses")
    if changed != len(a) or not py_after < py_before - 1.0:
        raise SystemExit("gpt.py: the fine-tuned weights did not all change, or did not learn")
    print("gpt.py: ok")


def test(d, program, text_file, steps):
    make(d, 2, 4, 64, 64, 0)
    r = subprocess.run([program, "--pretrained", str(d / "model.safetensors"), "--out",
                        str(d / "finetuned.safetensors"), "--text", text_file, "--steps",
                        str(steps)], capture_output=True, text=True, timeout=600)
    print(r.stdout, end="")
    if r.returncode != 0:
        print(r.stderr, end="")
        raise SystemExit(f"gpt.py: the program failed ({r.returncode})")
    before = float(re.search(r"validation loss before fine-tuning: ([0-9.]+)", r.stdout)[1])
    after = float(re.search(r"validation loss after [0-9]+ steps: ([0-9.]+)", r.stdout)[1])
    check(d / "model.safetensors", d / "finetuned.safetensors", text_file, before, after)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["make", "check", "test"])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text")
    ap.add_argument("--before", type=float)
    ap.add_argument("--after", type=float)
    ap.add_argument("--program")
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.mode == "make":
        make(Path(a.paths[0]), a.layers, a.heads, a.width, a.context, a.seed)
    elif a.mode == "check":
        check(a.paths[0], a.paths[1], a.text, a.before, a.after)
    else:
        test(Path(a.paths[0]), a.program, a.text, a.steps)


if __name__ == "__main__":
    sys.exit(main())
