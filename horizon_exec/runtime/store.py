"""Host parameter store: the schedule's static host buffers, allocated once.

Per unit (embedding, each block, the head): fp32 master weights, Adam moments (m then v, one
contiguous buffer), the optional working copy in the compute dtype, and (pipelined mode) the
host gradient that crosses the step boundary; plus 8-byte scalars (per-unit squared grad norms,
the global norm). Everything is carved out of ONE allocation from the backend (`host_raw`:
registered/pinned once on CUDA, so there are not thousands of pinned tensors and no
power-of-two rounding), page-aligned per buffer. Shapes and dtypes are the schedule's
(Buffer.shape, Buffer.dtype); buffers are found by what they hold, never by name.
"""
import torch

from horizon_exec.model.layout import host_layout
from horizon_sim.schedule.op import Holds, Space
from horizon_sim.specs.model import ModelSpec

ALIGN = 4096


def host_numel(m: ModelSpec, unit: int) -> int:
    """Parameters a unit keeps on the host (the tied head: its norm only)."""
    return host_layout(m, unit).numel


class HostStore:
    def __init__(self, sched, m: ModelSpec, backend, dist=None):
        from horizon_exec.dtypes import TORCH_DTYPE
        # Two allocations: the rank's own, and (data parallel) the node's, shared by its ranks
        # (Buffer.node_shared: master, moments and working copy, one copy per node).
        plans, totals = {False: [], True: []}, {False: 0, True: 0}
        for name, b in sched.buffers.items():
            if b.space != Space.HOST or not b.static:
                continue
            sh = bool(b.node_shared)
            plans[sh].append((name, totals[sh], TORCH_DTYPE[b.dtype], b.bytes))
            totals[sh] += -(-b.bytes // ALIGN) * ALIGN
        self.nbytes = totals[False] + totals[True]
        self.raw = backend.host_raw(totals[False])  # (total,) uint8: the rank's one allocation
        self.raw.zero_()                             # moments and step counters start at zero
        self.shared_raw = None
        if totals[True]:
            from horizon_exec.dist.shared import map_node_shared
            self.shared_raw = backend.register_host(map_node_shared(dist, totals[True]))  # zeroed
        self.t: dict[str, torch.Tensor] = {}
        for sh, raw in ((False, self.raw), (True, self.shared_raw)):
            self.t.update({name: raw[off:off + nb].view(dt) for name, off, dt, nb in plans[sh]})
        self.sched = sched
        # Adam's step counter per unit that has moments
        self.steps = {b.unit: torch.zeros((), dtype=torch.float32) for b in sched.of(Holds.MOMENTS)}

    def of(self, holds: Holds, unit: int | None = None) -> torch.Tensor:
        """A static host buffer by what it holds (Schedule.find)."""
        return self.t[self.sched.find(holds, unit).name]

    def has(self, holds: Holds, unit: int | None = None) -> bool:
        return self.sched.has(holds, unit) and self.sched.find(holds, unit).name in self.t

    def moments(self, unit: int):
        """(m, v) flat views of a unit's Adam moments (as the buffer holds them: the node's
        chunks in a data-parallel run)."""
        t = self.of(Holds.MOMENTS, unit)
        n = t.numel() // 2
        return t[:n], t[n:]

    def scalar(self, holds: Holds, unit: int | None = None) -> float:
        return float(self.of(holds, unit).item())

    def __contains__(self, name: str) -> bool:
        return name in self.t
