"""Memory effects of each op, derived once from its buffer accesses in program order: the
dynamic bytes it allocates when it starts (first write of a buffer's lifetime, plus its
workspace) and releases when it ends (buffers it frees, plus its workspace)."""
from dataclasses import dataclass, field

from horizon_sim.schedule.op import Space


@dataclass(slots=True)
class Effects:
    alloc: dict = field(default_factory=dict)  # (space, role) -> bytes taken at op start
    free: dict = field(default_factory=dict)   # (space, role) -> bytes released at op end
    taken: list = field(default_factory=list)  # names of the buffers whose lifetime starts here
    given: list = field(default_factory=list)  # names of the buffers released at op end

    def add(self, which: dict, space, role, nbytes):
        which[(space, role)] = which.get((space, role), 0) + nbytes


def op_effects(sched) -> list[Effects]:
    live: set[str] = set()
    out = []
    for op in sched.ops:
        e = Effects()
        for name in op.writes:
            b = sched.buffers[name]
            if not b.static and name not in live:
                live.add(name)
                e.taken.append(name)
                e.add(e.alloc, b.space, b.role, b.bytes)
        if op.workspace_bytes:
            e.add(e.alloc, Space.DEVICE, "workspace", op.workspace_bytes)
            e.add(e.free, Space.DEVICE, "workspace", op.workspace_bytes)
        for name in op.frees:
            b = sched.buffers[name]
            live.discard(name)
            e.given.append(name)
            e.add(e.free, b.space, b.role, b.bytes)
        out.append(e)
    return out
