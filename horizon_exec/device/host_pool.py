"""Dynamic host buffers at their exact size, kept when freed and handed out again for the same
size: host checkpoints, per-step host gradients and (CUDA) widening stages, on both backends.
The planner counts what this holds (horizon_sim/sim/memory.py host_footprint).

Why not torch's pinned caching allocator (`pin_memory=True`): it rounds every block up to a
power of two and keeps it, so a 436 MB layer gradient of an 8B model holds 512 MiB and a
1.05 GB embedding gradient 2 GiB: host RAM the planner never counted, lost on the machine
whose host RAM is the limit. Here a block is made at its exact size by `new_block` (CUDA:
plain memory page-locked in place with cudaHostRegister, once) and reused for that size.

Reuse is safe across streams: a buffer is freed on the host when the op that frees it has
been *issued*, while copies queued before it may still read or write it. give() stores a
fence with the block (a CUDA event recorded on the freeing lane's stream, which the schedule
ordered after every use of the buffer), and take() reuses a block only once its fence has
passed; otherwise it makes a new one. Memory held is then, per size, the most blocks of that
size ever live at once (plus any whose fence was late), with no rounding. (Unlike torch's
allocator it never serves one size from another's block; a schedule has a handful of sizes:
a boundary activation, a layer's, the embedding's and the head's gradient.)
"""
import threading
from typing import Callable

import torch

from horizon_exec.errors import ExecError


class HostPool:
    def __init__(self, new_block: Callable[[int], torch.Tensor], fence: Callable[[], object] = lambda: None):
        """new_block(nbytes) -> a (nbytes,) uint8 host tensor; fence() -> an object with
        query() (True once the current lane's queued work has passed it), or None for 'now'."""
        self._new_block, self._fence = new_block, fence
        self._free: dict[int, list] = {}       # nbytes -> [(block, fence)], oldest first
        self._out: dict[int, torch.Tensor] = {}  # data_ptr of a handed-out buffer -> its block
        self._lock = threading.Lock()
        self.blocks: list[torch.Tensor] = []
        self.held_bytes = 0

    def take(self, shape, dtype) -> torch.Tensor:
        """An uninitialised host tensor of `shape` and `dtype`, from a free block of exactly its
        size whose fence has passed, else from a new block."""
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        with self._lock:
            blk = None
            for i, (b, f) in enumerate(self._free.get(nbytes, ())):
                if f is None or f.query():
                    blk = self._free[nbytes].pop(i)[0]
                    break
        if blk is None:  # outside the lock: page-locking a large block takes a while
            blk = self._new_block(nbytes)
            with self._lock:
                self.blocks.append(blk)
                self.held_bytes += nbytes
        t = blk.view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype)
        with self._lock:
            if nbytes:
                self._out[t.data_ptr()] = blk
        return t

    @property
    def handed_out(self) -> int:
        """Blocks taken and not given back yet."""
        with self._lock:
            return len(self._out)

    def give(self, t: torch.Tensor) -> None:
        """Return a tensor from take(): its block is reused once the current lane's queued
        work (the copies the schedule ordered before this free) has passed."""
        if t.numel() == 0:
            return
        fence = self._fence()
        with self._lock:
            blk = self._out.pop(t.data_ptr(), None)
            if blk is None:
                raise ExecError(f"a host tensor {tuple(t.shape)} {t.dtype} given back to the pool "
                                "was not taken from it (or was given back twice)")
            self._free.setdefault(blk.numel(), []).append((blk, fence))
