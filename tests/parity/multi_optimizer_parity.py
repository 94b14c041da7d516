"""Fixture of loom's several-optimizers parity test (tests/unit/toolbox/multi_optimizer_test.cpp).

  python multi_optimizer_parity.py OUTPUT_FILE      writes the fixture (torch.save)

Python's recipe for several optimizers under one GradScaler, on the CPU in fp16 autocast: a
Linear-ReLU-Linear model whose first layer torch.optim.SGD (momentum, for-loop) trains and whose
second layer torch.optim.AdamW(fused=True) trains; every step

    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = cross_entropy(out.float(), y)
    scaler.scale(loss).backward()
    [scaler.unscale_(sgd); clip_grad_norm_(first layer, 0.5)]      on CLIP steps
    scaler.step(sgd); scaler.step(adamw); scaler.update()

Some steps write inf or nan into one layer's scaled gradient after backward, so that one
optimizer skips while the other steps, and the scale backs off once for the step. The fixture
holds the initial weights, the batches, the injections, every step's loss, what each optimizer
did, the scale and growth tracker after each update, the final weights and the scaler's state.
"""

import sys

import torch

STEPS = 24
INIT_SCALE, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 1000.0, 2.0, 0.5, 3
CLIP = {3, 7, 12, 15}                  # steps that unscale the SGD half and clip it to 0.5
INJECT = {                             # step -> (layer, flat index, value) in the scaled grad
    5: [(1, 0, float("inf"))],         # AdamW's half only: SGD steps
    9: [(0, 3, float("nan"))],         # SGD's half only: AdamW steps
    13: [(1, 2, float("-inf"))],
    18: [(0, 0, float("inf")), (1, 1, float("nan"))],  # both skip
}


def model():
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def main():
    torch.manual_seed(11)
    m = model()
    init = {k: v.clone() for k, v in m.state_dict().items()}
    layers = [m[0], m[2]]
    sgd = torch.optim.SGD(m[0].parameters(), lr=0.05, momentum=0.9, foreach=False)
    adamw = torch.optim.AdamW(m[2].parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_factor=GROWTH_FACTOR,
                                  backoff_factor=BACKOFF_FACTOR, growth_interval=GROWTH_INTERVAL)
    xs, ys, losses, applied, scales, trackers = [], [], [], [], [], []
    for step in range(STEPS):
        x = torch.randn(16, 6) * (1 + step % 3)
        y = torch.randint(0, 3, (16,))
        xs.append(x)
        ys.append(y)
        with torch.autocast("cpu", dtype=torch.float16):
            out = m(x)
        loss = torch.nn.functional.cross_entropy(out.float(), y)
        losses.append(loss.detach().clone())
        scaler.scale(loss).backward()
        for layer, index, value in INJECT.get(step, []):
            layers[layer].weight.grad.view(-1)[index] = value
        if step in CLIP:
            scaler.unscale_(sgd)
            torch.nn.utils.clip_grad_norm_(m[0].parameters(), 0.5)
        scaler.step(sgd)
        scaler.step(adamw)
        row = []
        for opt in (sgd, adamw):
            found = sum(v.item() for v in scaler._per_optimizer_states[id(opt)]
                        ["found_inf_per_device"].values())
            row.append(int(found == 0))
        applied.append(row)
        scaler.update()
        scales.append(scaler.get_scale())
        trackers.append(scaler._get_growth_tracker())
        sgd.zero_grad()
        adamw.zero_grad()

    fixture = {
        "init": init,
        "x": torch.stack(xs),
        "y": torch.stack(ys),
        "clip": sorted(CLIP),
        "inject": [[step, layer, index, value] for step, items in sorted(INJECT.items())
                   for layer, index, value in items],
        "loss": torch.stack(losses),
        "applied": torch.tensor(applied, dtype=torch.int64),
        "scale": torch.tensor(scales, dtype=torch.float64),
        "tracker": torch.tensor(trackers, dtype=torch.int64),
        "final": {k: v.clone() for k, v in m.state_dict().items()},
        "scaler": scaler.state_dict(),
    }
    torch.save(fixture, sys.argv[1])
    skipped = {name: [s for s in range(STEPS) if applied[s][i] == 0]
               for i, name in enumerate(("sgd", "adamw"))}
    print(f"multi_optimizer_parity: torch {torch.__version__}, {STEPS} steps, skipped {skipped}, "
          f"final scale {scaler.get_scale()} -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
