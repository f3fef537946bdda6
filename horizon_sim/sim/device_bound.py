"""The device memory a step can need at most, whatever the timing: the bound the Schedule's
dependencies (backpressure included) and FIFO lanes guarantee, beside the typical peak the
simulation finds (memory.device_trace). Admission and the fit verdict use this bound: a late
offload (a slow or busy link) can raise the real peak above the simulated one, never above it.

Method. Happens-before: x -> y when y depends on x, directly, transitively, or by following
x on its lane (lanes run their ops in schedule order). A dynamic device buffer lives from the
start of the op that first writes it, A, to the end of the op that frees it, F (releases
first at equal times). The compute lane's ops c_1 -> c_2 -> ... are totally ordered, so every
instant of a step lies inside some c_k or in the gap between c_k's end and c_{k+1}'s start.
  - Inside c: a live buffer has neither F -> c (freed before c starts) nor c -> A (allocated
    after c ends).
  - In the gap after c_k: neither F -> c_k nor F = c_k (freed by c_k's end), neither
    c_{k+1} -> A nor A = c_{k+1} (allocated at c_{k+1}'s start or later).
Any buffer live at such an instant, in any execution the Schedule allows, passes the test,
so the sum of those that pass, plus the workspaces of the ops that may run then (inside c:
c's own and, per other lane, the largest of an op unordered with c; in a gap: per non-compute
lane, the largest of an op neither before c_k's end nor after c_{k+1}'s start), bounds what is
live there; the bound is the static bytes plus the largest such sum. No buffer can have
A after and F before the same op (a cycle), so each sum is
    Σ all buffers - Σ buffers allocated after the window - Σ buffers freed before it,
two weighted counts over bitsets of ancestors and descendants (Python ints, one bit per op).
The compute lane is a chain, so its ops' ancestor sets only grow along it and their
descendant sets only shrink: each count is carried from one compute op to the next by the
ops that joined (or left), and per other lane the ops unordered with an op are a range whose
ends only move forward. The whole bound is one pass over the chain, not a pass over every op
per compute op (which made a step of 100 micro-batches spend seconds here).
Anchoring on the compute lane keeps the bound tight: a long host op that overlaps the whole
forward would, taken as the anchor, admit every activation the forward ever makes.
"""
import numpy as np

from horizon_sim.schedule.check import predecessors, topo_order
from horizon_sim.schedule.effects import op_effects
from horizon_sim.schedule.op import Lane, Space


def _order_and_edges(sched):
    """(topological order, predecessors, successors per op): deps plus each op's lane
    predecessor (check.py's view of the order)."""
    preds = [sorted(set(ps)) for ps in predecessors(sched)]
    succs: list[list[int]] = [[] for _ in preds]
    for o, ps in enumerate(preds):
        for p in ps:
            succs[p].append(o)
    return topo_order(sched), preds, succs


def _closures(sched) -> tuple[list[int], list[int]]:
    """Per op, the bitsets (Python ints, bit i = op i) of its ancestors and descendants."""
    order, preds, succs = _order_and_edges(sched)
    n = len(sched.ops)
    anc = [0] * n
    for o in order:
        a = 0
        for p in preds[o]:
            a |= anc[p] | (1 << p)
        anc[o] = a
    desc = [0] * n
    for o in reversed(order):
        d = 0
        for s in succs[o]:
            d |= desc[s] | (1 << s)
        desc[o] = d
    return anc, desc


def _ids(x: int) -> np.ndarray:
    """The positions of x's set bits."""
    if not x:
        return np.zeros(0, dtype=np.int64)
    lo = (x & -x).bit_length() - 1
    x >>= lo
    raw = np.frombuffer(x.to_bytes((x.bit_length() + 7) // 8, "little"), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(raw, bitorder="little")) + lo


def _weighted(x: int, w: np.ndarray) -> int:
    """Σ w[i] over x's set bits."""
    return int(w[_ids(x)].sum())


class _LaneWorkspaces:
    """One non-compute lane's ops that take a device workspace, in lane order. An op's
    ancestors on its lane are a prefix of it and its descendants a suffix, so the lane's ops
    unordered with an op are a contiguous range; both ends only move forward along the
    compute lane (its ancestors grow, its descendants shrink)."""

    def __init__(self, ids: list[int], ws: np.ndarray):
        self.ids, self.ws = ids, ws[ids] if ids else np.zeros(0, dtype=np.int64)
        self.p = self.q = 0

    def prefix(self, anc: int) -> int:
        """How many of the lane's ops are in `anc` (monotone: call with growing sets)."""
        while self.p < len(self.ids) and (anc >> self.ids[self.p]) & 1:
            self.p += 1
        return self.p

    def suffix(self, desc: int) -> int:
        """Where the lane's ops in `desc` start (monotone: call with shrinking sets)."""
        while self.q < len(self.ids) and not (desc >> self.ids[self.q]) & 1:
            self.q += 1
        return self.q

    def largest(self, p: int, q: int) -> int:
        return int(self.ws[p:q].max()) if p < q else 0


def device_peak_bound(sched, staging: bool = True, effects=None) -> int:
    """The most device bytes a step can hold at once in any execution the Schedule allows
    (module docstring). staging: as in memory.device_trace (copies' device staging counts,
    except on a CPU-driven link)."""
    return max(device_peak_by_anchor(sched, staging, effects).values())


def anchor_key(op) -> str:
    """The place in a step a device peak is reached at: the kind and unit of the compute op
    under it (or before whose start it is), whatever the micro-batch."""
    return f"{op.kind.value}[{op.unit}]"


def device_peak_by_anchor(sched, staging: bool = True, effects=None) -> dict:
    """device_peak_bound per place it can be reached (anchor_key; 'end': after the last
    compute op), the static bytes included: a peak that moves from one place to another as
    micro-batches are added is extended place by place (extend.py)."""
    effects = op_effects(sched) if effects is None else effects
    n = len(sched.ops)
    static = sched.static_bytes(Space.DEVICE)
    if n == 0:
        return {"end": static}
    anc, desc = _closures(sched)
    alloc = np.zeros(n, dtype=np.int64)
    free = np.zeros(n, dtype=np.int64)
    ws = np.zeros(n, dtype=np.int64)
    for op, e in zip(sched.ops, effects):
        for (sp, role), b in e.alloc.items():
            if sp != Space.DEVICE:
                continue
            if role == "workspace":
                if op.lane == Lane.COMPUTE or staging:
                    ws[op.id] += b
            else:
                alloc[op.id] += b
        for (sp, role), b in e.free.items():
            if sp == Space.DEVICE and role != "workspace":
                free[op.id] += b
    total = int(alloc.sum())
    compute = [o.id for o in sched.lane_ops(Lane.COMPUTE)] if Lane.COMPUTE in sched.lanes else []
    m = len(compute)
    freed_before = [0] * m   # Σ free over each compute op's ancestors
    for k, c in enumerate(compute):
        prev = freed_before[k - 1] if k else 0
        grown = anc[c] & ~anc[compute[k - 1]] if k else anc[c]
        freed_before[k] = prev + _weighted(grown, free)
    alloc_after = [0] * m     # Σ alloc over each compute op's descendants
    for k in reversed(range(m)):
        c = compute[k]
        nxt = alloc_after[k + 1] if k + 1 < m else 0
        shrunk = desc[c] & ~desc[compute[k + 1]] if k + 1 < m else desc[c]
        alloc_after[k] = nxt + _weighted(shrunk, alloc)
    lanes = [_LaneWorkspaces([o.id for o in sched.lane_ops(lane) if ws[o.id] > 0], ws)
             for lane in sched.lanes if lane != Lane.COMPUTE]
    lanes = [l for l in lanes if l.ids]
    best: dict = {}
    # Per other lane, its ops before the window are a prefix and those after it a suffix. Inside
    # c_k: c_k's ancestors and descendants. In the gap before c_k: c_(k-1) and its ancestors
    # (the prefix is c_(k-1)'s own: c_(k-1) is on no other lane), c_k and its descendants.
    p_prev = [0] * len(lanes)
    for k, c in enumerate(compute):
        p_in = [l.prefix(anc[c]) for l in lanes]
        q_in = [l.suffix(desc[c]) for l in lanes]
        before = (freed_before[k - 1] + int(free[compute[k - 1]])) if k else 0
        gap = total - (alloc_after[k] + int(alloc[c])) - before
        gap += sum(l.largest(p, q) for l, p, q in zip(lanes, p_prev, q_in))
        inside = total - alloc_after[k] - freed_before[k] + int(ws[c])
        inside += sum(l.largest(p, q) for l, p, q in zip(lanes, p_in, q_in))
        key = anchor_key(sched.ops[c])
        best[key] = max(best.get(key, 0), gap, inside)
        p_prev = p_in
    # the gap after the last compute op: nothing after it is excluded
    before = (freed_before[-1] + int(free[compute[-1]])) if m else 0
    gap = total - before + sum(l.largest(p, len(l.ids)) for l, p in zip(lanes, p_prev))
    best["end"] = gap
    return {k: int(static + v) for k, v in best.items()}
