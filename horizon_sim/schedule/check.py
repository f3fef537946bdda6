"""Schedule structural check (not `horizon validate`, which is predicted vs measured): ids,
lanes, acyclicity, data hazards through buffers, memory balance, typed buffer fields.

Hazards are checked against program order: for each buffer, a read must be ordered after the
latest write (RAW), a write after every earlier read and write since (WAR, WAW: this is "no
slot is overwritten while in use"), and a free after every access. "Ordered after" means
reachable through deps plus each lane's FIFO order, the only orders either interpreter keeps."""
from collections import defaultdict

from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import DTYPE_BYTES_OF, LANE_OF, Holds, OpKind


class ScheduleError(HorizonError):
    """A schedule that an interpreter must not run."""


def predecessors(sched) -> list[list[int]]:
    """deps plus the previous op on the same lane, for every op."""
    last_on_lane: dict = {}
    preds = []
    for op in sched.ops:
        p = list(op.deps)
        if op.lane in last_on_lane:
            p.append(last_on_lane[op.lane])
        last_on_lane[op.lane] = op.id
        preds.append(p)
    return preds


def topo_order(sched) -> list[int]:
    """Kahn's algorithm over deps + lane order; raises ScheduleError naming an op on a cycle."""
    n = len(sched.ops)
    preds = predecessors(sched)
    succs = [[] for _ in range(n)]
    indeg = [0] * n
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
            indeg[i] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    order = []
    while ready:
        i = ready.pop()
        order.append(i)
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(order) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise ScheduleError(f"schedule has a dependency cycle through op {stuck} "
                            f"({sched.ops[stuck].label})")
    return order


def ancestors(sched) -> list[int]:
    """Bitset (Python int) of all ops each op is ordered after."""
    preds = predecessors(sched)
    anc = [0] * len(sched.ops)
    for i in topo_order(sched):
        a = 0
        for p in preds[i]:
            a |= anc[p] | (1 << p)
        anc[i] = a
    return anc


def _check_buffers(sched) -> None:
    """Every buffer says what it holds, and its size is its shape times its dtype's size; no
    two buffers hold the same thing for the same unit, micro-batch and boundary."""
    seen = {}
    for name, b in sched.buffers.items():
        if b.name != name:
            raise ScheduleError(f"buffer listed as {name!r} is named {b.name!r}")
        if not isinstance(b.holds, Holds):
            raise ScheduleError(f"buffer {name!r} does not say what it holds")
        if b.dtype not in DTYPE_BYTES_OF:
            raise ScheduleError(f"buffer {name!r} has dtype {b.dtype!r}; known: {', '.join(DTYPE_BYTES_OF)}")
        if b.numel * DTYPE_BYTES_OF[b.dtype] != b.bytes or not b.shape:
            raise ScheduleError(f"buffer {name!r}: shape {b.shape} of {b.dtype} is not {b.bytes} bytes")
        key = (b.holds, b.unit, b.micro, b.layer)
        if key in seen:
            raise ScheduleError(f"buffers {seen[key]!r} and {name!r} both hold {b.holds.value} for the same "
                                "unit, micro-batch and boundary")
        seen[key] = name


def check_schedule(sched) -> None:
    _check_buffers(sched)
    ops = sched.ops
    for pos, op in enumerate(ops):
        if op.id != pos:
            raise ScheduleError(f"op at position {pos} has id {op.id}; ids must be 0..n-1 in order")
        if not isinstance(op.kind, OpKind) or op.kind not in LANE_OF:
            raise ScheduleError(f"op {op.id} has unknown kind {op.kind!r}")
        for d in op.deps:
            if not (0 <= d < len(ops)) or d == op.id:
                raise ScheduleError(f"op {op.id} ({op.label}) depends on op {d}, which does not exist")
        for name in op.reads + op.writes + op.frees:
            if name not in sched.buffers:
                raise ScheduleError(f"op {op.id} ({op.label}) uses unknown buffer {name!r}")
    anc = ancestors(sched)

    def ordered(before: int, after: int) -> bool:
        return bool(anc[after] >> before & 1)

    last_write: dict[str, int] = {}
    reads_since: dict[str, list[int]] = defaultdict(list)
    accesses: dict[str, list[int]] = defaultdict(list)
    live: set[str] = set()
    freed: set[str] = set()
    for op in ops:
        for name in op.reads:
            if name in freed:
                raise ScheduleError(f"op {op.id} ({op.label}) reads {name!r} after it was freed")
            w = last_write.get(name)
            if w is None and not sched.buffers[name].static:
                raise ScheduleError(f"op {op.id} ({op.label}) reads {name!r} before anything writes it")
            if w is not None and w != op.id and not ordered(w, op.id):
                raise ScheduleError(
                    f"op {op.id} ({op.label}) reads {name!r} without waiting for op {w} "
                    f"({ops[w].label}) that writes it")
        for name in op.writes:
            if name in freed:  # a new lifetime: the old one's accesses all ended at its free
                freed.discard(name)
                last_write.pop(name, None)
                reads_since[name] = []
                accesses[name] = []
            prior = reads_since[name] + ([last_write[name]] if name in last_write else [])
            for p in prior:
                if p != op.id and not ordered(p, op.id):
                    raise ScheduleError(
                        f"op {op.id} ({op.label}) overwrites {name!r} while op {p} "
                        f"({ops[p].label}) may still use it")
            if not sched.buffers[name].static:
                live.add(name)
        for name in op.reads:
            reads_since[name].append(op.id)
            accesses[name].append(op.id)
        for name in op.writes:
            last_write[name] = op.id
            reads_since[name] = []
            accesses[name].append(op.id)
        for name in op.frees:
            if sched.buffers[name].static:
                raise ScheduleError(f"op {op.id} ({op.label}) frees static buffer {name!r}")
            if name not in live:
                raise ScheduleError(f"op {op.id} ({op.label}) frees {name!r}, which is not allocated")
            for p in accesses[name]:
                if p != op.id and not ordered(p, op.id):
                    raise ScheduleError(
                        f"op {op.id} ({op.label}) frees {name!r} while op {p} ({ops[p].label}) "
                        "may still use it")
            live.discard(name)
            freed.add(name)
    # Memory effects balance over a step: every dynamic buffer allocated is released.
    if live:
        name = sorted(live)[0]
        raise ScheduleError(f"memory does not balance over the step: {len(live)} dynamic buffer(s) "
                            f"never freed, e.g. {name!r}")
    unused = [n for n, b in sched.buffers.items() if not b.static and n not in accesses]
    if unused:
        raise ScheduleError(f"dynamic buffer {unused[0]!r} is declared but never used")
