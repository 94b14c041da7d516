"""Writes the fixture of loom's DistributedSampler parity test
(tests/unit/data/distributed_sampler_test.cpp, the [parity] case).

Draws random cases (dataset size, replicas, shuffle, drop_last, seed, epoch) with a fixed
seed, asks torch.utils.data.DistributedSampler for every rank's indices and writes one line
per rank:  N R shuffle drop_last seed epoch rank : indices...

Usage: python distributed_sampler_parity.py OUTPUT_FILE
"""

import random
import sys

import torch
from torch.utils.data import DistributedSampler

CASES = 200


def main():
    rng = random.Random(20261201)
    lines = []
    for _ in range(CASES):
        n = rng.choice([0, 1, 2, 3, 7, 10, 31, 64, 100, 257, 1000, 4099])
        r = rng.randint(1, 9)
        shuffle = rng.random() < 0.7
        drop_last = rng.random() < 0.4
        seed = rng.choice([0, 1, 42, 12345, 2**31 + 7])
        epoch = rng.randint(0, 20)
        for rank in range(r):
            s = DistributedSampler(range(n), num_replicas=r, rank=rank, shuffle=shuffle,
                                   seed=seed, drop_last=drop_last)
            s.set_epoch(epoch)
            idx = list(s)
            if len(idx) != len(s):
                raise AssertionError(f"DistributedSampler yielded {len(idx)} indices but its "
                                     f"len() is {len(s)} (n={n}, replicas={r}, rank={rank})")
            lines.append(f"{n} {r} {int(shuffle)} {int(drop_last)} {seed} {epoch} {rank} : "
                         + " ".join(map(str, idx)))
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"distributed_sampler_parity: {len(lines)} rank lines from {CASES} cases")


if __name__ == "__main__":
    main()
