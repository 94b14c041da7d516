"""The Python pattern loom::Published is measured against (docs/embedding.md): a learner
process sends its weights to an actor process through a torch.multiprocessing queue.

The learner trains the same MLP as loom_bench_published (Linear(256, W), ReLU, Linear(W, W),
ReLU, Linear(W, 256), batch 64, AdamW(fused=True)) and after every step offers a copy of its
state_dict() (cloned: a tensor put on the queue shares its storage, so the live parameters
would be read while the optimizer writes them) with its version and send time to a queue of
one slot, never waiting (a full queue: this version is skipped). The actor process takes the
newest state when there is one, loads it (load_state_dict) and runs the model on one
observation, under inference_mode, in a loop. One intra-op thread each.

Prints the same lines as loom_bench_published: the actor's latency (p50, p99; a step that
loads new weights included), the learner's steps per second without and with sending, and
the time from a send to the actor's first forward with those weights (weights visible).

  python python_queue.py [--seconds S] [--rounds R] [--width W]
"""

import argparse
import queue
import statistics
import time

import torch
import torch.multiprocessing as mp


def mlp(width):
    return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 256))


def quantile(values, q):
    if not values:
        return 0.0
    values = sorted(values)
    return values[int(q * (len(values) - 1))]


def actor(width, weights, stop, results):
    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = mlp(width).eval()
    obs = torch.randn(1, 256)
    latencies, visible = [], []
    with torch.inference_mode():
        while not stop.is_set():
            t0 = time.perf_counter()
            newest = None
            while True:
                try:
                    newest = weights.get_nowait()
                except queue.Empty:
                    break
            if newest is not None:
                version, sent, state = newest
                model.load_state_dict(state)
            model(obs)
            t1 = time.perf_counter()
            latencies.append((t1 - t0) * 1e6)
            if newest is not None:
                visible.append((t1 - sent) * 1e6)
    results.put((quantile(latencies, 0.5), quantile(latencies, 0.99),
                 quantile(visible, 0.5), quantile(visible, 0.99)))


def run(width, seconds, sending):
    ctx = mp.get_context("spawn")
    weights, results, stop = ctx.Queue(maxsize=1), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=actor, args=(width, weights, stop, results))
    proc.start()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = mlp(width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    time.sleep(1.0)  # the actor is up
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps += 1
        if sending:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            try:
                weights.put_nowait((steps, time.perf_counter(), state))
            except queue.Full:
                pass
    elapsed = time.perf_counter() - start
    stop.set()
    p50, p99, v50, v99 = results.get(timeout=120)
    proc.join(timeout=60)
    return p50, p99, steps / elapsed, v50, v99


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    off, on = [], []
    for _ in range(args.rounds):
        off.append(run(args.width, args.seconds, False))
        on.append(run(args.width, args.seconds, True))

    def med(rows, i):
        return statistics.median(r[i] for r in rows)

    print(f"actor_p50_us_off {med(off, 0):.1f}\nactor_p99_us_off {med(off, 1):.1f}")
    print(f"actor_p50_us_on {med(on, 0):.1f}\nactor_p99_us_on {med(on, 1):.1f}")
    print(f"learner_steps_per_s_off {med(off, 2):.2f}\nlearner_steps_per_s_on {med(on, 2):.2f}")
    print(f"visible_p50_us {med(on, 3):.1f}\nvisible_p99_us {med(on, 4):.1f}")
    print(f"p99_on_over_off {med(on, 1) / med(off, 1):.3f}")
    print(f"steps_on_over_off {med(on, 2) / med(off, 2):.3f}")


if __name__ == "__main__":
    main()
