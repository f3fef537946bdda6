"""A step of many micro-batches, simulated as a few and extended.

A step's ops grow with micro-batches x (layers + 1), and past FULL_PASSES such passes a full
simulation takes seconds (its happens-before bound also holds a bit per pair of ops). But a
step's micro-batches repeat. Once there are enough of them that the work each micro-batch adds
hides the work a step does once (a unit's optimizer, its weight load, its gradient offload),
every figure of the step grows by the same amount per added micro-batch: its time, each lane's
busy time, the waits charged to each cause, device and host bytes by role. Where that point
lies is estimated from the cost model (settle_micro_batches). The step is then simulated at
three equally spaced counts from there; every figure must lie on the line through them
(within EXTEND_REL once carried to the step's count), or the counts move further on. The
figures are extended along the line to the step's count. Where the counts would reach the
step's own, it is simulated in full.

A peak (the device bound, the timeline's device peak) is the largest of the peaks at each
place in the step (device_bound.anchor_key), and the place that holds it can change as
micro-batches are added: each place's peak is extended and the largest taken.

Only the figures are extended: the result's Schedule, timeline and device trace are the
largest count simulated, and SimResult.extension says so.
"""
import math
from dataclasses import dataclass, fields, replace

from horizon_sim.schedule.limits import layer_passes
from horizon_sim.schedule.op import Family, Lane, OpKind
from horizon_sim.sim.memory import HostFootprint
from horizon_sim.sim.summary import StepTotals
from horizon_sim.specs.policy import Policy

FULL_PASSES = 1024
"""Layer passes (micro-batches x (layers + 1)) simulated in full; a step with more is
extended. 1,024 passes (~8,000 ops) take about half a second."""
EXTEND_REL = 5e-3
"""How far off the line through the first two counts the third count's figures may lie, times
the number of such spacings from the last count to the step's (a kink between the counts
carried to the step's count): a fraction of the step time (times) or of the step's device
bound or host total (bytes)."""
MIN_SAMPLE = 2
"""The fewest micro-batches simulated for an extension: a step's first and last micro-batch
differ from the others (the pipelined optimizer's previous step, the last gradients' offload),
so the counts start at two, and each count after adds one between them."""


@dataclass(frozen=True, slots=True)
class Extension:
    """How a SimResult's figures were made for a step of many micro-batches."""
    policy: Policy
    """The step's policy (the Schedule in the result is of `simulated[-1]` micro-batches)."""
    simulated: tuple[int, ...]
    """The micro-batch counts simulated; the figures lie on the line through them."""
    per_micro_batch_s: float
    """What each further micro-batch adds to the step time."""
    timeline_peak: bool = True
    """Whether the timeline's own device peak was extended too (else it is the bound: see
    TIMELINE_PEAK)."""


def extended(model, policy: Policy, full_passes: int = FULL_PASSES) -> bool:
    """Whether Horizon's training step of `model` under `policy` is simulated as a few
    micro-batches and extended."""
    return layer_passes(model.n_layers, policy.micro_batches) > full_passes


def extends(sched) -> bool:
    """Whether `sched`'s step is simulated as a few micro-batches and extended."""
    m = sched.meta
    return m.family == Family.HORIZON and m.purpose == "train" and extended(m.model, m.policy)


def with_micro_batches(policy: Policy, k: int) -> Policy:
    """`policy` at k micro-batches of the same size."""
    return replace(policy, batch=policy.micro_batch * k, micro_batches=k)


def settle_micro_batches(mb_order: str, hw, build) -> float:
    """From how many micro-batches on the work a micro-batch adds hides the work a step does
    once (module docstring): per unit and lane, the work of 1 and 2 micro-batches gives the
    constant part a and the per-micro-batch part b (cost model, nothing sharing a resource;
    compute by unit and kind of op, the rest by unit and lane). In the micro order a
    micro-batch passes every unit before the next starts, so the step's once-only work is set
    against a whole pass (the busiest lane's b summed over units); in the layer order every
    micro-batch passes a unit in one phase (its forwards, or its recomputes and backwards)
    before the next phase, and a unit's once-only work (its optimizer, its weight load) may
    fall in any phase, so the largest a is set against the smallest b of a phase's compute.
    build(k): the step's Schedule at k micro-batches."""
    from horizon_sim.sim.costs import CostModel
    work = []
    for k in (1, 2):
        s = build(k)
        costs = CostModel(hw, s.meta.policy.compute_dtype, s.meta)
        w: dict = {}
        for op in s.ops:
            key = (op.unit, op.kind if op.lane == Lane.COMPUTE else op.lane)
            w[key] = w.get(key, 0.0) + costs.alone_s(op)
        work.append(w)
    keys = set(work[0]) | set(work[1])
    b = {k: max(0.0, work[1].get(k, 0.0) - work[0].get(k, 0.0)) for k in keys}
    a = {k: max(0.0, work[0].get(k, 0.0) - b[k]) for k in keys}
    if mb_order == "layer":
        per_micro = min((b[k] for k in keys if isinstance(k[1], OpKind) and b[k] > 0), default=0.0)
        once = max(a.values(), default=0.0)
    else:
        def lane(k):
            return Lane.COMPUTE if isinstance(k[1], OpKind) else k[1]
        per_micro = max(sum(b[k] for k in keys if lane(k) == x) for x in {lane(k) for k in keys})
        once = max(sum(a[k] for k in keys if lane(k) == x) for x in {lane(k) for k in keys})
    return once / per_micro if per_micro > 0 else math.inf


def _line(x1, x2, x3):
    """x at k3 + t * (k3 - k2) for the figures x1, x2, x3 at three equally spaced counts, and
    how far x3 lies off the line through x1 and x2 (per figure, the largest)."""
    if isinstance(x1, dict):
        keys = list(dict.fromkeys([*x1, *x2, *x3]))
        parts = {k: _line(x1.get(k, 0), x2.get(k, 0), x3.get(k, 0)) for k in keys}
        return (lambda t: {k: f(t) for k, (f, _) in parts.items()}), max((e for _, e in parts.values()), default=0.0)
    if isinstance(x1, str):
        return (lambda t: x3), 0.0 if x1 == x2 == x3 else math.inf
    off = abs(x3 - (2 * x2 - x1))
    if isinstance(x1, int):
        return (lambda t: max(0, int(round(x3 + t * (x3 - x2))))), off
    return (lambda t: max(0.0, x3 + t * (x3 - x2))), off


def _scale(t: StepTotals, name: str) -> float:
    """What a figure's distance off the line is measured against (EXTEND_REL)."""
    if name in ("tokens", "model_flops", "hw_flops"):
        return max(abs(getattr(t, name)), 1.0)
    if name.startswith("device") or name == "disk_bytes":
        return max(t.device_bound_bytes, 1)
    return t.step_s


TIMELINE_PEAK = "device_typical_by_anchor"
"""The simulated timeline's own device peak: no verdict uses it (the bound is the fit's
figure), and it settles later than the rest where a prefetch runs further ahead the longer a
phase lasts (the layer order's checkpoint loads). Where it is off its line the rest is still
extended, and it is taken as the extended bound (what it can reach at most)."""


def extend_totals(samples, k: int):
    """(StepTotals, HostFootprint, whether the timeline's peak lay on its line) at k
    micro-batches from three (count, StepTotals, HostFootprint) at equally spaced counts, or
    None where they do not lie on a line."""
    (k1, t1, h1), (k2, t2, h2), (k3, t3, h3) = samples
    assert k2 - k1 == k3 - k2 > 0
    steps = (k - k3) / (k3 - k2)
    carried = max(1.0, steps)
    out, timeline_peak = {}, True
    for f in fields(StepTotals):
        line, off = _line(getattr(t1, f.name), getattr(t2, f.name), getattr(t3, f.name))
        if off * carried > EXTEND_REL * _scale(t3, f.name):
            if f.name != TIMELINE_PEAK:
                return None
            timeline_peak = False
        out[f.name] = line(steps)
    bound = out["device_bound_by_anchor"]
    out[TIMELINE_PEAK] = ({a: min(v, max(bound.values())) for a, v in out[TIMELINE_PEAK].items()}
                          if timeline_peak else dict(bound))
    host = {}
    for f in fields(HostFootprint):
        line, off = _line(getattr(h1, f.name), getattr(h2, f.name), getattr(h3, f.name))
        if off * carried > EXTEND_REL * max(h3.total_bytes, 1):
            return None
        host[f.name] = line(steps)
    host["total_bytes"] = int(sum(host["by_role"].values()))
    return StepTotals(**out), HostFootprint(**host), timeline_peak


def sample_counts(settle: float, k: int) -> tuple[int, int, int] | None:
    """Three equally spaced micro-batch counts from `settle` on, or None where they would
    reach k, or hold as many micro-batches as k (simulate k in full: it costs no more)."""
    k1 = max(MIN_SAMPLE, math.ceil(settle)) if math.isfinite(settle) else k
    d = max(1, math.ceil(k1 / 4))  # wider apart for larger counts: a stepwise figure averages out
    return None if 3 * (k1 + d) >= k else (k1, k1 + d, k1 + 2 * d)
