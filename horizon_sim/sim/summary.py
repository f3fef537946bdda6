"""The figures a user reads first: speed, utilization, what is exposed, what limits the step,
and whether it fits."""
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from horizon_sim.schedule.op import Lane, OpKind, Space
from horizon_sim.sim.device_bound import anchor_key
from horizon_sim.sim.verdict import MemoryVerdict
from horizon_sim.units import fmt_bytes

_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class Summary:
    step_time_s: float
    tokens_per_s: float
    """Of the whole job: every rank's tokens (data parallel) per step time."""
    model_TFLOPs: float
    """Achieved model FLOP/s (PaLM 6N + 12LHT definition), 1e12."""
    mfu: float
    hfu: float
    """Executed FLOPs (recompute included) / step time / peak."""
    lane_busy: dict
    """Busy fraction of the step per lane."""
    exposed_copy_s: float
    """Compute-idle time spent waiting on host<->device copies."""
    exposed_optimizer_s: float
    """Compute-idle time spent waiting on the CPU optimizer."""
    exposed_host_s: float
    """Compute-idle time spent waiting on other host work (embedding gather/scatter, norms)."""
    bottleneck: str
    roofline_s: float
    """Lower bound: the busiest lane's work with nothing sharing its resources."""
    device_peak_bytes: int
    """The most device memory the step can need whatever the timing (device_bound.py: what
    the Schedule's dependencies and backpressure guarantee); what `fits` uses."""
    device_typical_peak_bytes: int
    """The device memory peak of the simulated timeline (a late offload can raise it, up to
    device_peak_bytes)."""
    device_usable_bytes: int
    host_bytes: int
    host_usable_bytes: int
    fits: bool
    why: str
    memory: MemoryVerdict
    """The verdict behind fits and why (verdict.py: need by role against usable)."""
    exposed_network_s: float = 0.0
    """Compute-idle time spent waiting on collectives (fabric, network)."""
    exposed_disk_s: float = 0.0
    """Compute-idle time spent waiting on the disk tier's reads and writes."""
    ranks: int = 1
    """Data-parallel ranks (devices) the step runs on; host figures are per node."""

    def to_dict(self) -> dict:
        return asdict(self)


def _category(op) -> str:
    if op.lane in (Lane.H2D, Lane.D2H):
        return "copy"
    if op.lane == Lane.CPU:
        return "optimizer" if op.kind == OpKind.OPTIMIZER else "host"
    if op.lane in (Lane.FABRIC, Lane.NET):
        return "network"
    if op.lane == Lane.DISK:
        return "disk"
    return "compute"


def exposed_time(sched, tl: pd.DataFrame) -> dict:
    """Attribute every compute-idle interval to what the next compute op was waiting for:
    walk back the chain of latest-finishing predecessors and charge each link's overlap with
    the idle interval to its category (copy, optimizer, host)."""
    start = dict(zip(tl.op_id, tl.start_s))
    end = dict(zip(tl.op_id, tl.end_s))
    step_end = tl.end_s.max()
    preds: dict[int, list[int]] = {}
    last = {}
    for op in sched.ops:
        preds[op.id] = list(op.deps) + ([last[op.lane]] if op.lane in last else [])
        last[op.lane] = op.id
    out = {"copy": 0.0, "optimizer": 0.0, "host": 0.0, "network": 0.0, "disk": 0.0}
    compute = [op.id for op in sched.ops if op.lane == Lane.COMPUTE]
    gaps = []
    prev_end = 0.0
    for c in compute:
        if start[c] > prev_end + _EPS:
            gaps.append((prev_end, start[c], c))
        prev_end = end[c]
    # The tail after the last compute op: blame the op that ends the step.
    if step_end > prev_end + _EPS:
        gaps.append((prev_end, step_end, max(end, key=lambda i: (end[i], i))))
    for a, b, target in gaps:
        charged = b
        node = target
        # the target itself, when it is not compute, is the first link of the chain
        chain = [] if sched.ops[node].lane == Lane.COMPUTE else [node]
        while True:
            ps = [p for p in preds[node] if end[p] > a + _EPS]
            if not ps:
                break
            node = max(ps, key=lambda p: (end[p], p))
            if sched.ops[node].lane == Lane.COMPUTE:
                break
            chain.append(node)
        for n in chain:  # chain runs backwards in time; charge non-overlapping pieces
            lo, hi = max(start[n], a), min(end[n], charged)
            if hi > lo:
                out[_category(sched.ops[n])] += hi - lo
                charged = lo
    return out


@dataclass(frozen=True, slots=True)
class StepTotals:
    """What a simulated step adds up to, before ratios and verdicts. Each field grows by a fixed
    amount per micro-batch once a step's micro-batches have settled, which is how a step of
    many micro-batches is extended from a few (extend.py)."""
    step_s: float
    tokens: int
    """This rank's tokens."""
    model_flops: float
    hw_flops: float
    """FLOPs executed on the device, recompute included."""
    lane_busy_s: dict
    """Seconds each lane (by value, in the Schedule's lane order) runs an op."""
    lane_alone_s: dict
    """Seconds each lane's ops take with nothing else running (the roofline's terms)."""
    dram_s: float
    """Host DRAM bytes of the non-compute ops at the bus's rate."""
    exposed_s: dict
    """Compute-idle seconds charged to each category (exposed_time)."""
    device_typical_by_anchor: dict
    """The simulated timeline's device peak per place in the step (device_bound.anchor_key:
    the compute op under it)."""
    device_bound_by_anchor: dict
    """The happens-before bound per place (device_bound.device_peak_by_anchor)."""
    device_static: dict
    """Static device buffers' bytes by role (weight slots, ...)."""
    disk_bytes: int
    compute_dtype: str
    """The dtype whose peak FLOP/s MFU is taken against."""

    @property
    def device_typical_bytes(self) -> int:
        return max(self.device_typical_by_anchor.values())

    @property
    def device_bound_bytes(self) -> int:
        return max(self.device_bound_by_anchor.values())


def _by_anchor(sched, tl, trace) -> dict:
    """The device trace's peak per place in the step: each sample goes to the compute op
    running at its time or, between compute ops, to the one that ran last."""
    comp = tl[tl.lane == Lane.COMPUTE.value].sort_values("start_s", kind="stable")
    if comp.empty:
        return {"end": int(trace.bytes.max())}
    keys = np.array([anchor_key(sched.ops[i]) for i in comp.op_id])
    at = np.searchsorted(comp.start_s.to_numpy(), trace.time_s.to_numpy(), side="right") - 1
    peaks = pd.Series(trace.bytes.to_numpy()).groupby(keys[np.clip(at, 0, len(keys) - 1)]).max()
    return {k: int(v) for k, v in peaks.items()}


def step_totals(sched, tl, trace, costs, device_bound_by_anchor: dict | None = None) -> StepTotals:
    """The totals of `sched`'s simulated timeline `tl` and device `trace` (device_bound_by_anchor:
    device_bound.device_peak_by_anchor's, the simulated peaks where not given)."""
    busy = tl.groupby("lane")["dur_s"].sum()
    alone = {}
    for op in sched.ops:
        alone[op.lane.value] = alone.get(op.lane.value, 0.0) + costs.alone_s(op)
    dram_bytes = sum(f.nbytes for op in sched.ops if op.lane != Lane.COMPUTE for f in costs.flows(op) if f.dram)
    typical = _by_anchor(sched, tl, trace)
    static = {}
    for b in sched.buffers.values():
        if b.static and b.space == Space.DEVICE:
            static[b.role] = static.get(b.role, 0) + b.bytes
    return StepTotals(
        step_s=float(tl.end_s.max()), tokens=sched.meta.tokens, model_flops=sched.meta.model_flops,
        hw_flops=float(tl.flops.sum()),
        lane_busy_s={lane.value: float(busy.get(lane.value, 0.0)) for lane in sched.lanes},
        lane_alone_s=alone, dram_s=dram_bytes / costs.dram_Bps, exposed_s=exposed_time(sched, tl),
        device_typical_by_anchor=typical,
        device_bound_by_anchor=typical if device_bound_by_anchor is None else dict(device_bound_by_anchor),
        device_static=static, disk_bytes=sched.static_bytes(Space.DISK),
        compute_dtype=sched.meta.policy.compute_dtype)


def _bottleneck(lane_busy: dict, exposed: dict) -> str:
    if lane_busy.get("compute", 0.0) >= 0.95:
        return "compute"
    worst = max(exposed, key=lambda k: exposed[k])
    if exposed[worst] <= 0:
        return "compute"
    if worst == "network":
        busiest = max(("fabric", "net"), key=lambda l: lane_busy.get(l, 0.0))
        return "network between nodes" if busiest == "net" else "device fabric (reduce-scatter)"
    if worst == "copy":
        busiest = max(("h2d", "d2h"), key=lambda l: lane_busy.get(l, 0.0))
        return f"link ({busiest} copies)"
    return {"optimizer": "cpu optimizer", "host": "host work (embedding, norms)",
            "disk": "disk tier (reads and writes of the moments)"}[worst]


def summary_of(t: StepTotals, hw, host, ranks: int) -> Summary:
    """The Summary of a step's totals on `hw`, with its host footprint `host`."""
    step = t.step_s
    peak_flops = (hw.device.bf16_TFLOPs if t.compute_dtype == "bf16" else hw.device.fp32_TFLOPs) * 1e12
    lane_busy = {lane: s / step for lane, s in t.lane_busy_s.items()}
    roofline = max(max(t.lane_alone_s.values()), t.dram_s)
    exposed = t.exposed_s
    dev_peak = max(t.device_typical_bytes, t.device_bound_bytes)
    memory = memory_verdict(t.device_static, t.disk_bytes, hw, host, dev_peak)
    dev_ok, host_ok = memory.device_fits, memory.host_fits
    disk = memory.disk_need_bytes
    reasons = []
    if not dev_ok:
        reasons.append(f"device needs {fmt_bytes(dev_peak)} but {hw.device.name} has "
                       f"{fmt_bytes(hw.device_bytes_usable)} usable "
                       f"(short by {fmt_bytes(dev_peak - hw.device_bytes_usable)})")
    if not host_ok:
        reasons.append(f"host needs {fmt_bytes(host.total_bytes)} but {fmt_bytes(hw.host.ram_GiB * 2**30)} "
                       f"RAM leaves {fmt_bytes(hw.host_bytes_usable)} usable "
                       f"(short by {fmt_bytes(host.total_bytes - hw.host_bytes_usable)})")
    if not memory.disk_fits:
        reasons.append(f"disk tier needs {fmt_bytes(disk)} but the disk has {fmt_bytes(hw.disk_bytes_usable)} "
                       f"(short by {fmt_bytes(memory.disk_short_bytes)})")
    why = "; ".join(reasons) if reasons else (
        f"device {fmt_bytes(dev_peak)} of {fmt_bytes(hw.device_bytes_usable)} usable "
        f"({fmt_bytes(hw.device_bytes_usable - dev_peak)} to spare), "
        f"host {fmt_bytes(host.total_bytes)} of {fmt_bytes(hw.host_bytes_usable)} usable "
        f"({fmt_bytes(hw.host_bytes_usable - host.total_bytes)} to spare)"
        + (f", disk {fmt_bytes(disk)} of {fmt_bytes(hw.disk_bytes_usable)}" if disk else ""))
    return Summary(
        step_time_s=step, tokens_per_s=t.tokens * ranks / step,
        model_TFLOPs=t.model_flops / step / 1e12, mfu=t.model_flops / step / peak_flops,
        hfu=t.hw_flops / step / peak_flops, lane_busy=lane_busy,
        exposed_copy_s=exposed["copy"], exposed_optimizer_s=exposed["optimizer"],
        exposed_host_s=exposed["host"], bottleneck=_bottleneck(lane_busy, exposed), roofline_s=roofline,
        device_peak_bytes=dev_peak, device_typical_peak_bytes=t.device_typical_bytes,
        device_usable_bytes=int(hw.device_bytes_usable),
        host_bytes=host.total_bytes, host_usable_bytes=int(hw.host_bytes_usable),
        fits=memory.fits, why=why, memory=memory, exposed_network_s=exposed["network"],
        exposed_disk_s=exposed["disk"], ranks=ranks)


def memory_verdict(static: dict, disk_bytes: int, hw, host, device_bytes: int) -> MemoryVerdict:
    """The planner's verdict: the host footprint by role, and the device need (the bound) as
    the Schedule's static buffers by role (`static`) plus what the step adds, against the
    machine's usable memories."""
    device = {**static, "activations_grads_workspaces": device_bytes - sum(static.values())}
    return MemoryVerdict(host_need=dict(host.by_role), host_usable=int(hw.host_bytes_usable),
                         device_need=device, device_usable=int(hw.device_bytes_usable),
                         disk_need=disk_bytes, disk_usable=hw.disk_bytes_usable,
                         host_source=f"{fmt_bytes(hw.host.ram_GiB * 2**30)} RAM less the OS reserve",
                         device_source=f"{hw.device.name} less its reserve")
