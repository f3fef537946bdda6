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


def _bits(x: int, n: int) -> np.ndarray:
    """(n,) float64 0/1 of bit i of x."""
    raw = np.frombuffer(x.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(np.float64)


def device_peak_bound(sched, staging: bool = True, effects=None) -> int:
    """The most device bytes a step can hold at once in any execution the Schedule allows
    (module docstring). staging: as in memory.device_trace (copies' device staging counts,
    except on a CPU-driven link)."""
    effects = op_effects(sched) if effects is None else effects
    n = len(sched.ops)
    if n == 0:
        return sched.static_bytes(Space.DEVICE)
    order, preds, succs = _order_and_edges(sched)
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

    alloc = np.zeros(n)
    free = np.zeros(n)
    ws = np.zeros(n)
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
    total = alloc.sum()
    lanes = {lane: np.array([o.id for o in sched.lane_ops(lane) if ws[o.id] > 0], dtype=np.int64)
             for lane in sched.lanes}

    def workspaces(excluded: np.ndarray, lanes_in) -> float:
        """Per lane, the largest workspace of an op not excluded (1.0 = ordered away)."""
        out = 0.0
        for lane in lanes_in:
            ids = lanes[lane]
            if ids.size:
                out += float((ws[ids] * (1.0 - excluded[ids])).max())
        return out

    others = [lane for lane in sched.lanes if lane != Lane.COMPUTE]
    compute = [o.id for o in sched.lane_ops(Lane.COMPUTE)] if Lane.COMPUTE in sched.lanes else []
    best = 0.0
    for c in compute:  # inside each compute op
        d_bits, a_bits = _bits(desc[c], n), _bits(anc[c], n)
        excluded = np.maximum(d_bits, a_bits)
        excluded[c] = 1.0
        best = max(best, total - alloc @ d_bits - free @ a_bits + ws[c] + workspaces(excluded, others))
    for prev, nxt in zip([None, *compute], [*compute, None]):  # in each gap between them
        before = (anc[prev] | (1 << prev)) if prev is not None else 0
        after = (desc[nxt] | (1 << nxt)) if nxt is not None else 0
        b_bits, f_bits = _bits(after, n), _bits(before, n)
        excluded = np.maximum(b_bits, f_bits)
        best = max(best, total - alloc @ b_bits - free @ f_bits + workspaces(excluded, others))
    return int(sched.static_bytes(Space.DEVICE) + best)
