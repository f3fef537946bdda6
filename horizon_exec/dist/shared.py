"""The node's host store, one copy mapped by every local rank.

The local leader creates a file of the store's size in /dev/shm (RAM-backed: its pages are
the node's memory, counted once however many ranks map them), every local rank maps it
MAP_SHARED, and once all have mapped it the leader unlinks the name: the memory lives as
long as a mapping does and nothing is left behind in /dev/shm when the run ends or dies.
A fresh file reads as zeros (moments start at zero). On CUDA each rank page-locks its own
mapping (cudaHostRegister: the backend's `register_host`).
"""
import mmap
import os
from pathlib import Path

import torch

from horizon_sim.errors import HorizonError
from horizon_sim.units import fmt_bytes

SHM_DIR = Path("/dev/shm")


def map_node_shared(ctx, nbytes: int, what: str = "store") -> torch.Tensor:
    """A zeroed (nbytes,) uint8 tensor over memory shared by the node's ranks (collective
    over ctx's main group: every rank calls it, in the same order)."""
    path = SHM_DIR / f"{ctx.shm_tag}-{what}"
    size = max(nbytes, 1)
    err = ""
    if ctx.is_leader:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, size)
                os.posix_fallocate(fd, 0, size)  # the pages exist now: a full /dev/shm fails here, not mid-step
            finally:
                os.close(fd)
        except OSError as e:
            err = f"cannot make the node's shared {what} of {fmt_bytes(size)} at {path}: {e.strerror}"
            path.unlink(missing_ok=True)
    _agree(ctx, err)
    try:
        with open(path, "r+b") as f:
            m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED)
        err = ""
    except OSError as e:
        err = f"rank {ctx.rank} cannot map the node's shared {what} {path}: {e.strerror}"
    _agree(ctx, err)  # every rank has mapped it (or none goes on)
    if ctx.is_leader:
        path.unlink(missing_ok=True)
    return torch.frombuffer(m, dtype=torch.uint8, count=nbytes) if nbytes else torch.empty(0, dtype=torch.uint8)


def _agree(ctx, err: str) -> None:
    """Every rank learns whether any failed (so none waits for one that gave up)."""
    import torch.distributed as dist
    errs = [None] * ctx.world
    dist.all_gather_object(errs, err, group=ctx.groups["main"])
    bad = [e for e in errs if e]
    if bad:
        raise HorizonError(bad[0])
