"""What measuring every op's temporaries costs, priced where the CPU backend does it: the
executor tracks every compute op on every run for MoE models and document masks (and replays a
first run's figures elsewhere, RuntimeConfig.track_memory 'auto'); calibrate measures the tiny
model both ways ('<kind>_tracked' rows) and the planner takes the tracked rows for exactly the
schedules the executor tracks. The executor's rule and the planner's are one function."""
from dataclasses import replace

import pytest

from horizon_exec.measure.calibrate.overheads import tracked_overheads
from horizon_exec.runtime.config import RuntimeConfig
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import OpKind, build_schedule
from horizon_sim.sim.costs import CostModel
from horizon_sim.specs.hardware import tracks_every_op
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.cpu_machine import CPU_HW

DENSE = ModelSpec(name="d", n_layers=2, hidden=64, n_heads=2, n_kv_heads=1, ffn_hidden=128, vocab=256)
MOE = replace(DENSE, name="m", family="mixtral", n_experts=4, experts_per_token=2, expert_ffn_hidden=128,
              norm_topk_prob=True)
POL = Policy(batch=1, seq=32, act_ckpt_every=1)
DOCS = replace(POL, doc_masks=True)


@pytest.mark.parametrize("model, policy, every", [(DENSE, POL, False), (DENSE, DOCS, True), (MOE, POL, True)])
def test_the_executor_and_the_planner_track_the_same_schedules(model, policy, every):
    assert tracks_every_op(model, policy) is every
    assert RuntimeConfig().temporaries_for(model, policy) == ("every" if every else "once")
    hw = replace(CPU_HW, device=replace(CPU_HW.device, op_overhead_us=(("backward", 100.0), ("backward_tracked", 400.0),
                                                                       ("forward", 50.0), ("forward_tracked", 170.0))))
    sched = build_schedule(model, policy)
    costs = CostModel(hw, policy.compute_dtype, sched.meta)
    fwd = next(op for op in sched.ops if op.kind == OpKind.FORWARD)
    bwd = next(op for op in sched.ops if op.kind == OpKind.BACKWARD)
    overhead = lambda op: costs.compute_terms(op)["overhead"] - (costs._moe_overhead_s(op.kind, 32, model)  # noqa: E731
                                                                 if model.n_experts else 0.0)
    assert overhead(fwd) == pytest.approx((170e-6 if every else 50e-6))
    assert overhead(bwd) == pytest.approx((400e-6 if every else 100e-6))
    # a file without tracked rows (a GPU's, an older calibration) prices every schedule alike
    plain = replace(CPU_HW, device=replace(CPU_HW.device, op_overhead_us=(("forward", 50.0),)))
    assert CostModel(plain, policy.compute_dtype, sched.meta).compute_terms(fwd)["overhead"] \
        == pytest.approx(50e-6 + (costs._moe_overhead_s(OpKind.FORWARD, 32, model) if model.n_experts else 0.0))


def test_tracked_rows_are_kept_only_where_tracking_costs_more():
    rows = tracked_overheads({"forward": 900.0, "backward": 2400.0, "head": 1200.0, "recompute": 800.0},
                             {"forward": 1300.0, "backward": 2300.0, "head": 1500.0, "grad_norm": 5.0})
    assert rows == {"forward_tracked": 1300.0, "head_tracked": 1500.0}


def test_a_hardware_file_takes_tracked_rows_and_refuses_unknown_kinds():
    ok = replace(CPU_HW.device, op_overhead_us=(("forward_tracked", 10.0),))
    assert dict(ok.op_overhead_us) == {"forward_tracked": 10.0}
    with pytest.raises(HorizonError, match="forward_tracking"):
        replace(CPU_HW.device, op_overhead_us=(("forward_tracking", 10.0),))
