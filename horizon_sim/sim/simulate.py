"""Simulate one training step: a SimPy process per lane runs its ops in schedule order,
waits on SimPy events for dependencies, and takes durations from the cost model. Copies and
host CPU work stream through one shared DRAM bus (dram.py), so the optimizer and DMA slow
each other down when they overlap, and CPU-thread work shares the host lane cores
(HostSpec.lane_cores; the CPU backend's copies are such work). Deterministic: same inputs, same timeline.
A step of many micro-batches is simulated as a few and its figures extended (extend.py)."""
from dataclasses import dataclass

import pandas as pd
import simpy

from horizon_sim.errors import HorizonError
from horizon_sim.schedule.effects import op_effects
from horizon_sim.schedule.op import Lane
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.sim.costs import CostModel
from horizon_sim.sim.device_bound import device_peak_by_anchor
from horizon_sim.sim.dram import DramBus
from horizon_sim.sim.memory import HostFootprint, device_trace, host_footprint
from horizon_sim.schedule.limits import layer_passes
from horizon_sim.sim.extend import (FULL_PASSES, Extension, extend_totals, extends, sample_counts,
                                    settle_micro_batches, with_micro_batches)
from horizon_sim.sim.summary import StepTotals, Summary, step_totals, summary_of
from horizon_sim.sim.timeline import timeline_frame
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.units import GiB, MiB


@dataclass(frozen=True)
class SimResult:
    schedule: Schedule
    hardware: HardwareSpec
    timeline: pd.DataFrame
    device_trace: pd.DataFrame
    host: HostFootprint
    summary: Summary
    totals: StepTotals
    extension: Extension | None = None
    """Set where the figures were extended from fewer micro-batches than the step has (the
    schedule, timeline and device trace are then of the largest count simulated)."""

    @property
    def policy(self):
        """The step's policy (the Schedule's, unless the figures were extended)."""
        return self.extension.policy if self.extension else self.schedule.meta.policy


def contended_compute(env, work_s: float, bus: DramBus, contention: float):
    """Run `work_s` seconds of compute, at 1 / (1 + contention) of full speed while CPU-thread
    work streams on the host (a fluid model: the rate is re-read whenever such work starts or
    ends)."""
    if contention <= 0:
        yield env.timeout(work_s)
        return
    left = work_s
    while left > 1e-12:
        rate = 1.0 / (1.0 + contention) if bus.core_busy() else 1.0
        t0 = env.now
        yield env.timeout(left / rate) | bus.changed
        done = (env.now - t0) * rate
        if done <= 0 and env.now + left / rate <= env.now:  # float clock: see DramBus._run
            done = left
        left -= done


def _lane_process(env, ops, done, costs: CostModel, bus: DramBus, start, end, busy):
    for op in ops:
        if op.deps:
            yield env.all_of([done[d] for d in op.deps])
        start[op.id] = env.now
        if op.lane == Lane.COMPUTE:
            busy["compute"] = True
            yield from contended_compute(env, costs.compute_s(op), bus, costs.compute_contention)
            busy["compute"] = False
        else:
            extra = costs.busy_latency_s(op) if busy["compute"] else 0.0
            if extra:
                yield env.timeout(extra)
            for flow in costs.flows(op):
                if flow.latency_s:
                    yield env.timeout(flow.latency_s)
                if flow.dram:
                    yield bus.transfer(flow.nbytes, flow.cap_Bps, flow.core)
                elif flow.nbytes:
                    yield env.timeout(flow.nbytes / flow.cap_Bps)
        end[op.id] = env.now
        done[op.id].succeed()


def run_timeline(sched: Schedule, hw: HardwareSpec, costs: CostModel | None = None) -> pd.DataFrame:
    """Only the timeline: the predicted start and end of every op."""
    env = simpy.Environment()
    costs = costs or CostModel(hw, sched.meta.policy.compute_dtype, sched.meta)
    bus = DramBus(env, costs.dram_Bps, costs.lane_cores)
    done = [env.event() for _ in sched.ops]
    start, end = {}, {}
    busy = {"compute": False}  # is the compute lane running an op right now
    for lane in sched.lanes:
        env.process(_lane_process(env, sched.lane_ops(lane), done, costs, bus, start, end, busy))
    env.run()
    if len(end) != len(sched.ops):  # only a schedule that skipped validation can get here
        stuck = next(op for op in sched.ops if op.id not in end)
        raise RuntimeError(f"simulation deadlocked at {stuck.label}")
    return timeline_frame(sched.ops, [start[o.id] for o in sched.ops], [end[o.id] for o in sched.ops])


def check_layout(sched: Schedule, hw: HardwareSpec) -> None:
    """A Schedule built for N devices per node and M nodes runs only on such a cluster."""
    if sched.meta.layout != hw.cluster.layout:
        raise HorizonError(f"the schedule was built for {sched.meta.layout}; the hardware has {hw.cluster.layout}")


def simulate(sched: Schedule, hw: HardwareSpec) -> SimResult:
    """Simulate `sched` on `hw` (a step of many micro-batches: a few, extended)."""
    check_layout(sched, hw)
    if extends(sched):
        return simulate_policy(sched.meta.model, sched.meta.policy, hw)
    return simulate_full(sched, hw)


def simulate_policy(model, policy, hw: HardwareSpec, full_passes: int = FULL_PASSES) -> SimResult:
    """Build and simulate Horizon's step of `model` under `policy` on `hw`; a step of more
    than FULL_PASSES layer passes is simulated at a few micro-batch counts and extended, and
    only those are built (extend.py)."""
    from horizon_sim.schedule import build_schedule
    layout = hw.cluster.layout
    return simulate_micro_batches(lambda c: build_schedule(model, with_micro_batches(policy, c), layout),
                                  policy, model.n_layers, hw, full_passes)


def simulate_micro_batches(build, policy, n_layers: int, hw: HardwareSpec,
                           full_passes: int = FULL_PASSES) -> SimResult:
    """Simulate the step that build(policy.micro_batches) makes, any schedule family's: past
    full_passes layer passes at a few counts build(c) and extended (extend.py). `policy`: the
    step's Policy, as its Schedule's meta holds it."""
    from functools import lru_cache
    build = lru_cache(maxsize=None)(build)
    k = policy.micro_batches
    counts = None
    if layer_passes(n_layers, k) > full_passes:
        counts = sample_counts(settle_micro_batches(policy.mb_order, hw, build), k)
    while counts:
        runs = [simulate_full(build(c), hw) for c in counts]
        ext = extend_totals([(c, r.totals, r.host) for c, r in zip(counts, runs)], k)
        if ext is not None:
            totals, host, timeline_peak = ext
            last = runs[-1]
            slope = (last.totals.step_s - runs[-2].totals.step_s) / (counts[2] - counts[1])
            return SimResult(last.schedule, hw, last.timeline, last.device_trace, host,
                             summary_of(totals, hw, host, last.schedule.meta.layout.ranks), totals,
                             Extension(policy=policy, simulated=tuple(counts), per_micro_batch_s=slope,
                                       timeline_peak=timeline_peak))
        counts = sample_counts(2 * counts[0], k)  # not settled yet: further on
    return simulate_full(build(k), hw)


def simulate_full(sched: Schedule, hw: HardwareSpec) -> SimResult:
    """Simulate every op of `sched` on `hw`, however many micro-batches it has (what an
    extension is checked against)."""
    check_layout(sched, hw)
    costs = CostModel(hw, sched.meta.policy.compute_dtype, sched.meta)
    tl = run_timeline(sched, hw, costs)
    effects = op_effects(sched)  # which buffers each op takes and gives back: both traces use them
    # The math libraries' workspaces: taken at the first matmul and held, under every op.
    library_bytes = int(hw.device.library_workspace_MiB * MiB)
    trace = device_trace(sched, tl, staging=not hw.link.cpu_driven, effects=effects, runtime_bytes=library_bytes)
    host = host_footprint(sched, tl, int(hw.host.runtime_overhead_GiB * GiB), dma=not hw.link.cpu_driven,
                          effects=effects)  # the node's: its ranks' buffers, the shared store once
    bound = {k: v + library_bytes
             for k, v in device_peak_by_anchor(sched, staging=not hw.link.cpu_driven, effects=effects).items()}
    totals = step_totals(sched, tl, trace, costs, bound)
    return SimResult(sched, hw, tl, trace, host, summary_of(totals, hw, host, sched.meta.layout.ranks), totals)
