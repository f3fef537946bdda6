"""Benchmark: copy-on-write after a torch DataLoader forks its workers (Zero3Policy.fork_copies,
horizon_sim/peer/host_extras.py). A trainer that allocates pageable state (DeepSpeed's fp32 master
and Adam moments), then makes a DataLoader iterator with workers (Linux's fork start), then writes
every page of that state (the Adam step), holds it twice: the writer gets a private copy of each
page, the workers keep the originals. Forked before the state exists, nothing is copied.

Measured as the PSS (proportional set size, /proc/PID/smaps_rollup) summed over the trainer and
its workers, so pages they share count once, before and after one write of the whole state.

Run: .venv/bin/python benchmarks/fork_copies.py [--gib 1] [--workers 2]
"""
import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

GiB = 1 << 30


class Indices(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return i


def pss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def one(gib: float, workers: int, fork_first: bool) -> tuple[float, float]:
    """(PSS before, after) the write, GiB, over the trainer and its workers."""
    make = lambda: torch.zeros(int(gib * GiB) // 4)  # fp32, pageable, every page touched
    state = None if fork_first else make()
    it = iter(DataLoader(Indices(), batch_size=8, num_workers=workers))
    next(it)  # the workers are forked and running
    pids = [os.getpid(), *(w.pid for w in it._workers)]
    state = make() if fork_first else state
    before = sum(pss_bytes(p) for p in pids)
    state.add_(1.0)  # one write of every page, as an Adam step does
    time.sleep(0.5)
    after = sum(pss_bytes(p) for p in pids)
    del it
    return before / GiB, after / GiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, kernel {os.uname().release}, {a.workers} workers, {a.gib:g} GiB of state")
    for fork_first in (False, True):
        b, c = one(a.gib, a.workers, fork_first)
        d = round(c - b, 2) + 0.0  # no "-0.00"
        print(f"  workers forked {'before' if fork_first else 'after'} the state exists: PSS {b:.2f} GiB before "
              f"the write, {c:.2f} after ({d:+.2f})")


if __name__ == "__main__":
    main()
