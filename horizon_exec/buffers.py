"""Every buffer a Schedule names, resolved to a tensor.

Static ones exist for the whole run: the host store (store.py) and the device weight slots.
Dynamic ones are allocated when an op first writes them (device: from the arena, charged
against its budget; host: from the backend's HostPool, exact-size blocks reused, page-locked
on CUDA) and released when an op that lists them in `frees` completes. Shapes follow from the name and the model:
    x.m<m>.<l>, dx.m<m>.<l>   device (micro_batch, seq, H)  compute dtype  boundary activation / its grad
    dgrad.<u>.m<m>            device (device params of u,)  compute dtype  weight grads of one micro
    w<s>                      device (slot_bytes / act,)     compute dtype  weight slot
    emb.m<m>, ckpt.m<m>.<l>, hdx.m<m>  host (micro_batch, seq, H)  compute dtype
    hgrad.<u>                 host (host params of u,)       grad dtype, fp32 when accumulating
Each size is checked against the schedule's declared bytes at construction.
"""
import re
import threading

import torch

from horizon_exec.errors import ExecError
from horizon_exec.store import dtype_for, host_numel
from horizon_sim.schedule.op import Space
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}
_ACT = re.compile(r"(x|dx|emb|ckpt|hdx)\.m\d+(\.\d+)?$")
_DGRAD = re.compile(r"dgrad\.(\w+)\.m\d+$")
_SLOT = re.compile(r"w\d+$")


class BufferTable:
    def __init__(self, sched, m: ModelSpec, p: Policy, store, arena, backend):
        self.store, self.arena, self.backend = store, arena, backend
        self.declared = {n: b for n, b in sched.buffers.items()}
        self.act = TORCH_DTYPE[p.compute_dtype]
        self.shapes: dict[str, tuple] = {}
        for name, b in sched.buffers.items():
            if name in store:
                continue
            shape, dt = self._shape(m, p, name, b)
            if torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size() != b.bytes:
                raise ExecError(f"buffer {name!r}: schedule declares {b.bytes} bytes but {tuple(shape)} "
                                f"{dt} holds a different amount")
            self.shapes[name] = (shape, dt)
        self._host: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()
        self.host_live = self.host_peak = 0
        self.slots = {n: arena.alloc(n, *self.shapes[n], sched.buffers[n].bytes)
                      for n, b in sched.buffers.items() if _SLOT.match(n)}

    def _shape(self, m, p, name, b):
        act = self.act
        if _ACT.match(name):
            return (p.micro_batch, p.seq, m.hidden), act
        if mt := _DGRAD.match(name):
            u = mt.group(1)
            numel = m.head_device_params if u == "head" else m.layer_params
            return (numel,), act
        if _SLOT.match(name):
            return (b.bytes // act.itemsize,), act
        if name.startswith("hgrad.") and b.space == Space.HOST:
            numel = host_numel(m, name.partition(".")[2])
            return (numel,), dtype_for(name, b.bytes, numel)
        raise ExecError(f"buffer {name!r} has no meaning in the executor")

    # ---- access -----------------------------------------------------------------------------
    def get(self, name: str) -> torch.Tensor:
        """The live tensor of a buffer (static, or dynamic and allocated)."""
        if name in self.store:
            return self.store.t[name]
        if name in self.slots:
            return self.slots[name]
        t = self.arena.tensors.get(name)
        if t is None:
            t = self._host.get(name)
        if t is None:
            raise ExecError(f"buffer {name!r} is read but not allocated (freed, or never written)")
        return t

    def is_live(self, name: str) -> bool:
        return (name in self.store or name in self.slots or name in self.arena or name in self._host)

    def out(self, name: str) -> torch.Tensor:
        """The tensor an op writes into: allocated now if the buffer is dynamic and not live."""
        if self.is_live(name):
            return self.get(name)
        shape, dt = self.shapes[name]
        b = self.declared[name]
        if b.space == Space.DEVICE:
            return self.arena.alloc(name, shape, dt, b.bytes)
        t = self.backend.host_empty(shape, dt)
        with self._lock:
            self._host[name] = t
            self.host_live += b.bytes
            self.host_peak = max(self.host_peak, self.host_live)
        return t

    def put(self, name: str, t: torch.Tensor) -> None:
        """An op produced `t` as buffer `name`: adopt it (device) or copy it into place."""
        shape, dt = self.shapes[name]
        if tuple(t.shape) != tuple(shape) or t.dtype != dt:
            raise ExecError(f"an op produced {tuple(t.shape)} {t.dtype} for buffer {name!r}, "
                            f"expected {tuple(shape)} {dt}")
        if self.is_live(name) or self.declared[name].space == Space.HOST:
            self.out(name).copy_(t)
        else:
            self.arena.adopt(name, t, self.declared[name].bytes)

    def free(self, name: str) -> None:
        if name in self.arena:
            self.backend.release(self.arena.free(name))
            return
        with self._lock:
            t = self._host.pop(name)
            self.host_live -= self.declared[name].bytes
        self.backend.host_free(t)

    def clear_dynamic(self) -> None:
        """Drop every dynamic buffer (after a failed step; the lanes are idle)."""
        for name in [n for n in self.arena.tensors if n not in self.slots and n in self.declared]:
            self.arena.free(name)
        with self._lock:
            host, self._host = list(self._host.values()), {}
            self.host_live = 0
        for t in host:  # back to the pool, or its blocks would stay handed out for good
            self.backend.host_free(t)
