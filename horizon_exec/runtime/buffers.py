"""Every buffer a Schedule names, resolved to a tensor of the shape and dtype the Schedule
declares for it (Buffer.shape, Buffer.dtype: nothing is read out of a name).

Static ones exist for the whole run: the host store (store.py), and on the device the weight
slots and the constants (RoPE tables, the step's labels, documents and positions), allocated
here from the arena. Dynamic ones are allocated when an op first writes them (device: from the
arena, charged against its budget; host: from the backend's HostPool, exact-size blocks
reused, page-locked on CUDA) and released when an op that lists them in `frees` completes.
A DMA link's gradient landing stages (Buffer.dma_only) belong to the CUDA backend, which takes
them from its pool at the declared size; the CPU backend has none.
"""
import threading

import torch

from horizon_exec.errors import ExecError
from horizon_sim.schedule.op import Holds, Space

from horizon_exec.dtypes import TORCH_DTYPE


class BufferTable:
    def __init__(self, sched, store, arena, backend):
        self.sched, self.store, self.arena, self.backend = sched, store, arena, backend
        self.declared = sched.buffers
        for name, b in sched.buffers.items():
            if torch.Size(b.shape).numel() * TORCH_DTYPE[b.dtype].itemsize != b.bytes:
                raise ExecError(f"buffer {name!r}: schedule declares {b.bytes} bytes but {b.shape} {b.dtype} "
                                "holds a different amount")
        self._host: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()
        self.host_live = self.host_peak = 0
        # the device's static buffers: weight slots and constants
        self.static_device = {n: arena.alloc(n, b.shape, TORCH_DTYPE[b.dtype], b.bytes)
                              for n, b in sched.buffers.items() if b.static and b.space == Space.DEVICE}

    # ---- lookup by what a buffer holds -----------------------------------------------------------
    def find(self, holds: Holds, unit: int | None = None, micro: int | None = None,
             layer: int | None = None) -> torch.Tensor:
        """The live tensor of the buffer holding `holds` (Schedule.find)."""
        return self.get(self.sched.find(holds, unit, micro, layer).name)

    def one(self, names, *holds: Holds) -> str:
        """The name among `names` (an op's reads or writes) whose buffer holds `holds` (the
        first of them found)."""
        for h in holds:
            for n in names:
                if self.declared[n].holds == h:
                    return n
        raise ExecError(f"op names no {' or '.join(h.value for h in holds)} buffer in {names}")

    def all(self, names, holds: Holds) -> list[str]:
        """The names among `names` whose buffers hold `holds`, in order."""
        return [n for n in names if self.declared[n].holds == holds]

    # ---- access -----------------------------------------------------------------------------
    def get(self, name: str) -> torch.Tensor:
        """The live tensor of a buffer (static, or dynamic and allocated)."""
        if name in self.store:
            return self.store.t[name]
        if name in self.static_device:
            return self.static_device[name]
        t = self.arena.tensors.get(name)
        if t is None:
            t = self._host.get(name)
        if t is None:
            raise ExecError(f"buffer {name!r} is read but not allocated (freed, or never written)")
        return t

    def is_live(self, name: str) -> bool:
        return (name in self.store or name in self.static_device or name in self.arena or name in self._host)

    def out(self, name: str) -> torch.Tensor:
        """The tensor an op writes into: allocated now if the buffer is dynamic and not live."""
        if self.is_live(name):
            return self.get(name)
        b = self.declared[name]
        dt = TORCH_DTYPE[b.dtype]
        if b.space == Space.DEVICE:
            return self.arena.alloc(name, b.shape, dt, b.bytes)
        t = self.backend.host_empty(b.shape, dt)
        with self._lock:
            self._host[name] = t
            self.host_live += b.bytes
            self.host_peak = max(self.host_peak, self.host_live)
        return t

    def put(self, name: str, t: torch.Tensor) -> None:
        """An op produced `t` as buffer `name`: adopt it (device) or copy it into place."""
        b = self.declared[name]
        if tuple(t.shape) != b.shape or t.dtype != TORCH_DTYPE[b.dtype]:
            raise ExecError(f"an op produced {tuple(t.shape)} {t.dtype} for buffer {name!r}, "
                            f"expected {b.shape} {b.dtype}")
        if self.is_live(name) or b.space == Space.HOST:
            self.out(name).copy_(t)
        else:
            self.arena.adopt(name, t, b.bytes)

    def hold(self, name: str, obj) -> None:
        """An op made `obj` (a kept layer's graph: KeptGraph) the device buffer `name`: charged
        its declared bytes until an op frees it."""
        b = self.declared[name]
        if b.space != Space.DEVICE or self.is_live(name):
            raise ExecError(f"buffer {name!r} cannot hold an op's graph (not a device buffer, or live)")
        self.arena.hold(name, obj, b.bytes)

    def free(self, name: str) -> None:
        if self.declared[name].dma_only:
            return  # the backend's own stage (module docstring)
        if name in self.arena:
            t = self.arena.free(name)
            if isinstance(t, torch.Tensor):  # a held graph's tensors go with it (ops.forward_kept)
                self.backend.release(t)
            return
        with self._lock:
            t = self._host.pop(name)
            self.host_live -= self.declared[name].bytes
        self.backend.host_free(t)

    def clear_dynamic(self) -> None:
        """Drop every dynamic buffer (after a failed step; the lanes are idle)."""
        for name in [n for n in self.arena.tensors if n not in self.static_device and n in self.declared]:
            self.arena.free(name)
        with self._lock:
            host, self._host = list(self._host.values()), {}
            self.host_live = 0
        for t in host:  # back to the pool, or its blocks would stay handed out for good
            self.backend.host_free(t)
