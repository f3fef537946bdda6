"""Schedule: the ops of one training step in program order, plus the buffers they touch.

Program order defines semantics (what a read sees); each lane runs its ops in program order;
`deps` are the cross-lane waits. Build one with `build_schedule(model, policy)`."""
from dataclasses import dataclass
from functools import cached_property

from horizon_sim.schedule.op import Buffer, Holds, Lane, Op, ScheduleMeta, Space


@dataclass(frozen=True)
class Schedule:
    ops: tuple[Op, ...]
    buffers: dict[str, Buffer]
    meta: ScheduleMeta

    def __len__(self) -> int:
        return len(self.ops)

    def lane_ops(self, lane: Lane) -> list[Op]:
        return [op for op in self.ops if op.lane == lane]

    @cached_property
    def lanes(self) -> tuple[Lane, ...]:
        """Lanes that have ops, in a fixed order."""
        used = {op.lane for op in self.ops}
        return tuple(l for l in Lane if l in used)

    @cached_property
    def _index(self) -> dict:
        return {(b.holds, b.unit, b.micro, b.layer): b for b in self.buffers.values()}

    def find(self, holds: Holds, unit: int | None = None, micro: int | None = None,
             layer: int | None = None) -> Buffer:
        """The buffer that holds `holds` for that unit / micro-batch / boundary (KeyError if the
        step has none)."""
        return self._index[(holds, unit, micro, layer)]

    def has(self, holds: Holds, unit: int | None = None, micro: int | None = None,
            layer: int | None = None) -> bool:
        return (holds, unit, micro, layer) in self._index

    def of(self, *holds: Holds) -> list[Buffer]:
        """Every buffer holding one of `holds`, in declaration order."""
        return [b for b in self.buffers.values() if b.holds in holds]

    def static_bytes(self, space: Space) -> int:
        return sum(b.bytes for b in self.buffers.values() if b.static and b.space == space)

    def check(self) -> "Schedule":
        """Structural check (schedule/check.py): acyclic, dependencies exist, no slot overwritten
        in use, memory balances. Raises ScheduleError; returns self."""
        from horizon_sim.schedule.check import check_schedule
        check_schedule(self)
        return self
