"""The ZeRO-3 peer as DeepSpeed 0.19 runs it on one GPU (issue 26): per-tensor copies, a
synchronise per wait, module hooks, the fp32 gradient round trip, per-parameter norms and
DeepSpeedCPUAdam's own rate. Each is a knob on by default; each changes the plan the way it
should. Planner only, no clocks."""
from dataclasses import replace

import pytest

from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.peer.compare import plan_zero3
from horizon_sim.peer.zero3_builder import build_zero3_schedule
from horizon_sim.peer.zero3_counts import modules, tensors
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule.op import EMBED, OpKind
from horizon_sim.specs.block import parameters
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec

GPT2 = dict(n_heads=32, n_kv_heads=32, family="gpt2", vocab=50257, tied_embeddings=True)


def small(L=8, H=512):
    return ModelSpec(name=f"s{L}", n_layers=L, hidden=H, n_heads=4, n_kv_heads=2, ffn_hidden=1376, vocab=1024)


def step_s(model, hw, **kw) -> float:
    return plan_zero3(model, hw, Zero3Policy(**{"batch": 2, "seq": 256, **kw})).summary.step_time_s


def test_counts_come_from_the_block():
    m = small()
    assert tensors(m, 0) == len(parameters(m)) == 9  # 7 projections, 2 RMSNorm weights
    gpt = ModelSpec(name="g", n_layers=2, hidden=256, ffn_hidden=1024, **{**GPT2, "n_heads": 4, "n_kv_heads": 4})
    assert tensors(gpt, 0) == len(parameters(gpt))  # LayerNorm biases counted
    assert tensors(m, EMBED) == 1 and tensors(m, m.n_layers) == 2 and tensors(gpt, gpt.n_layers) == 2
    assert modules(m, 0) == 7 + 2 + 4


def test_each_mechanism_costs_time_and_off_is_faster():
    m, hw = small(), make_hardware("h100-sxm", "512GiB")
    on = step_s(m, hw)
    for knob in ("per_tensor_fetch", "sync_per_wait", "fp32_grad_copy", "per_param_norm"):
        assert step_s(m, hw, **{knob: False}) < on, knob
    assert step_s(m, hw, hook_us=0.0) < on < step_s(m, hw, hook_us=200.0)
    assert step_s(m, hw, tensor_op_us=0.0) < on < step_s(m, hw, tensor_op_us=100.0)


def test_the_mechanisms_in_the_schedule():
    m = small()
    s = build_zero3_schedule(m, Zero3Policy(batch=2, seq=256, max_reuse_distance_params=1))
    loads = [op for op in s.ops if op.kind == OpKind.LOAD_WEIGHTS and op.unit == 3 and op.micro == 0]
    assert sum(op.copies for op in loads[:1 + (len(loads) > 2)]) >= 1
    assert sum(op.copies for op in loads) == 2 * tensors(m, 3)  # fetched for the forward and again for the backward
    hooks = [op for op in s.ops if op.kind == OpKind.HOOKS]
    assert len(hooks) == 2 * m.n_layers + 1  # a forward and a backward per layer, the head's pair
    # sync_per_wait: a layer's hooks wait for its copies; off, they do not
    by_id = {op.id: op for op in s.ops}
    assert all(any(by_id[d].kind == OpKind.LOAD_WEIGHTS for d in op.deps) for op in hooks)
    s2 = build_zero3_schedule(m, Zero3Policy(batch=2, seq=256, sync_per_wait=False))
    assert not any(by_id2.kind == OpKind.LOAD_WEIGHTS for op in s2.ops if op.kind == OpKind.HOOKS
                   for by_id2 in (s2.ops[d] for d in op.deps))
    # every compute op waits for its hooks
    computes = [op for op in s.ops if op.kind in (OpKind.FORWARD, OpKind.BACKWARD, OpKind.HEAD)]
    assert all(any(by_id[d].kind == OpKind.HOOKS for d in op.deps) for op in computes)
    # the CPU accelerator (validate --peer) has none of them: its fixed costs are measured whole
    cpu = build_zero3_schedule(m, Zero3Policy(batch=2, seq=256), synchronous=True)
    assert not any(op.kind in (OpKind.HOOKS, OpKind.RELOAD_GRADS) or op.copies > 1 or op.fixed_us for op in cpu.ops)


def test_the_peer_runs_adam_at_deepspeeds_rate():
    m, hw = small(), make_hardware("a100-80gb", "256GiB")

    def adam_s(rate):
        h = replace(hw, host=replace(hw.host, deepspeed_adam_Gparams_per_s=rate))
        tl = plan_zero3(m, h, Zero3Policy(batch=2, seq=256)).timeline
        return float(tl[tl.kind == "optimizer"].dur_s.sum())
    assert adam_s(1.0) > 2 * adam_s(4.0)
    assert adam_s(0.0) == pytest.approx(adam_s(hw.host.adam_Gparams_per_s))  # 0: the host's AdamW rate
    assert make_hardware("v100-32gb").deepspeed_adam_Gparams_per_s == 1.6  # DGX-2, published
    assert make_hardware("gh200").deepspeed_adam_Gparams_per_s == 10.4  # Grace, published


def test_a_40b_gpt2_fits_a_32gb_v100_as_deepspeed_trained_it():
    m = ModelSpec(name="gpt2-40b", n_layers=50, hidden=8192, ffn_hidden=32768, **GPT2)
    r = plan_zero3(m, make_hardware("v100-32gb", "1.5TB"), Zero3Policy(batch=4, seq=1024))
    assert r.summary.fits, r.summary.why


@pytest.mark.parametrize("knobs, says", [("hook_us=-1", "hook_us"), ("tensor_op_us=x", "not a valid float"),
                                         ("sync_per_wait=maybe", "not a valid bool")])
def test_bad_knobs_are_one_line_and_exit_2(capsys, knobs, says):
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--ram", "256GiB", "--no-advice",
                 "--compare", "zero3-offload", "--peer-knobs", knobs]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err, err
    with pytest.raises(HorizonError):
        Zero3Policy(hook_us=float("nan"))
