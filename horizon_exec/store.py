"""Host parameter store: the schedule's static host buffers, allocated once.

Per unit (embedding, each block, the head): fp32 master weights, Adam moments (m then v, one
contiguous buffer), the optional working copy in the compute dtype, and (pipelined mode) the
host gradient that crosses the step boundary; plus 8-byte scalars (per-unit squared grad norms,
the global norm). Everything is carved out of ONE allocation from the backend (`host_raw`:
registered/pinned once on CUDA, so there are not thousands of pinned tensors and no
power-of-two rounding), page-aligned per buffer. Sizes and dtypes come from the schedule's
buffer table and are cross-checked against the model, so a builder/executor mismatch fails
here, at construction, with the buffer's name.
"""
import torch

from horizon_exec.errors import ExecError
from horizon_exec.layout import host_layout, unit_of
from horizon_sim.schedule.op import Space
from horizon_sim.specs.model import ModelSpec

ALIGN = 4096
DTYPE_OF_ITEMSIZE = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


def host_numel(m: ModelSpec, unit_name: str) -> int:
    return host_layout(m, unit_of(m, unit_name)).numel


def dtype_for(name: str, nbytes: int, numel: int):
    if numel <= 0 or nbytes % numel or nbytes // numel not in DTYPE_OF_ITEMSIZE:
        raise ExecError(f"buffer {name!r}: {nbytes} bytes do not hold {numel} elements of a known dtype")
    return DTYPE_OF_ITEMSIZE[nbytes // numel]


class HostStore:
    def __init__(self, sched, m: ModelSpec, backend):
        plan, total = [], 0
        for name, b in sched.buffers.items():
            if b.space != Space.HOST or not b.static:
                continue
            kind, _, unit = name.partition(".")
            if kind in ("gsq", "gnorm"):
                numel = 1
            elif kind in ("master", "wc", "hgrad"):
                numel = host_numel(m, unit)
            elif kind == "moments":
                numel = 2 * host_numel(m, unit)
            else:
                raise ExecError(f"static host buffer {name!r} has no meaning in the executor")
            plan.append((name, total, numel, dtype_for(name, b.bytes, numel), b.bytes))
            total += -(-b.bytes // ALIGN) * ALIGN
        self.nbytes = total
        self.raw = backend.host_raw(total)  # (total,) uint8: the one allocation
        self.raw.zero_()                    # moments and step counters start at zero
        self.t: dict[str, torch.Tensor] = {
            name: self.raw[off:off + nb].view(dt) for name, off, numel, dt, nb in plan}
        self.steps = {name.partition(".")[2]: torch.zeros((), dtype=torch.float32)
                      for name in self.t if name.startswith("moments.")}

    def moments(self, unit: str):
        """(m, v) flat views of a unit's Adam moments."""
        t = self.t[f"moments.{unit}"]
        n = t.numel() // 2
        return t[:n], t[n:]

    def scalar(self, name: str) -> float:
        return float(self.t[name].item())

    def __contains__(self, name: str) -> bool:
        return name in self.t
