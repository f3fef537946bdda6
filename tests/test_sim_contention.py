"""Compute slowed by host-lane work (HostSpec.compute_contention), worked by hand, and on a
whole schedule: busy compute grows by at most the factor, and not at all without the term."""
import dataclasses

import pytest
import simpy

from horizon_sim.schedule import Lane, build_schedule
from horizon_sim.sim.dram import DramBus
from horizon_sim.sim.simulate import contended_compute, simulate
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.cpu_machine import CPU_HW


def _finish(contention, flow_core=True, work_s=1.0):
    """Compute of `work_s` from t=0 beside one flow of 4 B at 10 B/s from t=0.2 to t=0.6."""
    env = simpy.Environment()
    bus = DramBus(env, 100.0, lane_cores=1)
    out = {}

    def compute():
        yield from contended_compute(env, work_s, bus, contention)
        out["t"] = env.now

    def flow():
        yield env.timeout(0.2)
        yield bus.transfer(4.0, 10.0, core=flow_core)
        out["flow_end"] = env.now

    env.process(compute())
    env.process(flow())
    env.run()
    assert out["flow_end"] == pytest.approx(0.6)
    return out["t"]


def test_compute_slows_only_while_host_work_streams():
    # 0.2 s at full speed, 0.4 s at 1/1.5 (0.2667 s of work), the remaining 0.5333 s at full
    assert _finish(0.5) == pytest.approx(0.6 + (1.0 - 0.2 - 0.4 / 1.5))
    assert _finish(0.0) == pytest.approx(1.0)
    assert _finish(0.5, flow_core=False) == pytest.approx(1.0)  # a DMA flow is not CPU work
    assert _finish(0.5, work_s=0.1) == pytest.approx(0.1)  # done before the flow starts


def test_schedule_compute_grows_by_at_most_the_factor():
    model = ModelSpec(name="t", n_layers=6, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=688, vocab=256)
    sched = build_schedule(model, Policy(batch=2, seq=256))
    c = 0.25
    slow_hw = dataclasses.replace(CPU_HW, host=dataclasses.replace(CPU_HW.host, compute_contention=c))
    base, slow = simulate(sched, CPU_HW), simulate(sched, slow_hw)

    def busy(tl):
        t = tl[tl.lane == Lane.COMPUTE.value]
        return (t.end_s - t.start_s).sum()

    b0, b1 = busy(base.timeline), busy(slow.timeline)
    assert b0 < b1 <= b0 * (1 + c) + 1e-9
    assert slow.summary.step_time_s > base.summary.step_time_s
