"""Dependencies from buffer accesses: an op that reads a buffer waits for its last writer
(RAW), one that writes it waits for the reads and the write since (WAR, WAW: a slot is never
overwritten while in use), one that frees it waits for every access. Only waits on other lanes
are kept, the latest per lane (a lane is FIFO: the earlier ones are implied)."""
from collections import defaultdict

from horizon_sim.schedule.op import LANE_OF


class Deps:
    """Derives each op's dependencies, in program order."""

    def __init__(self):
        self.lane_of: list = []
        self.last_write: dict[str, int] = {}
        self.reads_since: dict[str, list[int]] = defaultdict(list)
        self.accesses: dict[str, list[int]] = defaultdict(list)

    def written(self, name: str) -> bool:
        """The buffer has a live value (written, not freed since)."""
        return name in self.last_write

    def add(self, op_id, kind, reads, writes, frees, extra=()) -> tuple[int, ...]:
        """The deps of a new op; `extra` adds waits that are not data hazards (backpressure)."""
        need: set[int] = set(extra)
        for n in reads:
            if n in self.last_write:
                need.add(self.last_write[n])
        for n in writes:
            need.update(self.reads_since[n])
            if n in self.last_write:
                need.add(self.last_write[n])
        for n in frees:
            need.update(self.accesses[n])
        lane = LANE_OF[kind]
        latest: dict = {}
        for d in need:
            if d != op_id and self.lane_of[d] != lane and d > latest.get(self.lane_of[d], -1):
                latest[self.lane_of[d]] = d
        self.lane_of.append(lane)
        for n in reads:
            self.reads_since[n].append(op_id)
            self.accesses[n].append(op_id)
        for n in writes:
            self.last_write[n] = op_id
            self.reads_since[n] = []
            self.accesses[n].append(op_id)
        for n in frees:  # a later write starts a new lifetime with no history
            self.last_write.pop(n, None)
            self.reads_since.pop(n, None)
            self.accesses.pop(n, None)
        return tuple(sorted(latest.values()))
