"""The ZeRO-2 offload peer (Zero3Policy(offload_param=False), the family zero2-offload): every
parameter resident on the device, nothing fetched, gradients to the host per bucket, the CPU Adam,
then the updated parameters back over the link; its device bound and fit verdict; the V100
preset's compute rate against the log it is taken from. Planner only, no clocks."""
import json

import pytest

from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.peer.compare import plan_zero3, zero2_like
from horizon_sim.peer.zero2_builder import ZERO2_BUCKETS
from horizon_sim.peer.zero3_builder import build_zero3_schedule
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.plan.families import peer
from horizon_sim.schedule.check import ancestors
from horizon_sim.schedule.op import EMBED, Family, Holds, Lane, OpKind, Space
from horizon_sim.sim.device_bound import device_peak_bound
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.measured_kernels import (V100_MEGATRON_TFLOPs, V100_TUTORIAL_BACKWARD_S,
                                                V100_TUTORIAL_FORWARD_S)
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

GPT2 = dict(n_heads=32, n_kv_heads=32, family="gpt2", vocab=50257, tied_embeddings=True)


def small(L=4, H=256, V=512, tied=False):
    return ModelSpec(name=f"s{L}", n_layers=L, hidden=H, n_heads=4, n_kv_heads=2, ffn_hidden=688, vocab=V,
                     tied_embeddings=tied)


def gpt2(L, H=4096):
    return ModelSpec(name=f"gpt2-{L}x{H}", n_layers=L, hidden=H, ffn_hidden=4 * H, **GPT2)


def zero2(**kw) -> Zero3Policy:
    return Zero3Policy(**{"batch": 2, "seq": 64, "offload_param": False, **kw})


@pytest.mark.parametrize("kw", [dict(), dict(act_ckpt=False), dict(micro_batches=2, batch=4),
                                dict(micro_batches=2, batch=4, fp32_grad_copy=False), dict(overlap_comm=False),
                                dict(compute_dtype="fp32", grad_clip=0.0), dict(adam_copies_params=True),
                                dict(reduce_bucket_params=1)])
@pytest.mark.parametrize("tied", [False, True])
def test_parameters_stay_on_the_device_and_come_back_after_the_adam(kw, tied):
    m = small(tied=tied)
    z = zero2(**kw)
    s = build_zero3_schedule(m, z)  # .check(): hazards, balance, typed buffers
    assert s.meta.family is Family.ZERO2_OFFLOAD
    a = 4 if z.compute_dtype == "fp32" else 2
    # nothing fetched: no weight loads, and every parameter held on the device the whole step
    assert not any(op.kind == OpKind.LOAD_WEIGHTS for op in s.ops)
    held = [b for b in s.buffers.values() if b.holds == Holds.DEVICE_PARAMS]
    assert all(b.space == Space.DEVICE and b.static for b in held)
    assert sum(b.bytes for b in held) == a * m.total_params
    # the way back: one copy per unit, each after its unit's Adam, of every parameter
    up = [op for op in s.ops if op.kind == OpKind.UPLOAD_PARAMS]
    opt = {op.unit: op.id for op in s.ops if op.kind == OpKind.OPTIMIZER}
    assert sorted(op.unit for op in up) == sorted(opt) == [EMBED, *range(m.n_layers), m.n_layers]
    assert all(op.lane == Lane.H2D for op in up) and sum(op.link_bytes for op in up) == a * m.total_params
    anc = ancestors(s)
    for op in up:
        assert anc[op.id] >> opt[op.unit] & 1  # its own unit's Adam first
        # DeepSpeed 0.19: after the whole group's Adam; 2020-21's tiled copy: as soon as its own is done
        after_all = all(anc[op.id] >> i & 1 for i in opt.values())
        assert after_all != (z.adam_copies_params and op.unit != m.n_layers), op.label
    r = simulate(s, make_hardware("a100-80gb", "256GiB"))
    tl = r.timeline
    assert tl[tl.kind == "upload_params"].end_s.max() == pytest.approx(r.summary.step_time_s)


def test_gradients_go_down_per_bucket_and_buckets_are_reused_after_their_offload():
    m = small(L=8)
    s = build_zero3_schedule(m, zero2(reduce_bucket_params=2 * m.layer_params))
    d2h = sum(op.link_bytes for op in s.ops if op.kind == OpKind.OFFLOAD_GRADS)
    assert d2h == 4 * m.total_params  # one micro-batch: each gradient once, cast to fp32 on the device
    assert not any(op.kind == OpKind.RELOAD_GRADS for op in s.ops)
    buckets = [n for n, b in s.buffers.items() if b.holds == Holds.GRAD_BUCKET]
    assert len(buckets) == ZERO2_BUCKETS and all(s.buffers[n].static for n in buckets)
    # a bucket written again after its offload waits for that offload (the reuse event)
    anc = ancestors(s)
    for off in (op for op in s.ops if op.kind == OpKind.OFFLOAD_GRADS):
        (b,) = off.reads
        nxt = next((op for op in s.ops[off.id + 1:] if b in op.writes), None)
        if nxt is not None:
            assert anc[nxt.id] >> off.id & 1, (off.label, nxt.label)
    # several micro-batches: down in the compute dtype each time, up before the add, fp32 at the end
    s2 = build_zero3_schedule(m, zero2(batch=4, micro_batches=2))
    down = sum(op.link_bytes for op in s2.ops if op.kind == OpKind.OFFLOAD_GRADS)
    up = sum(op.link_bytes for op in s2.ops if op.kind == OpKind.RELOAD_GRADS)
    assert (down, up) == (2 * 2 * m.total_params + 4 * m.total_params, 2 * m.total_params)


def test_host_model_states_follow_deepspeeds_arithmetic():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    m = gpt2(8, 1024)
    hw = make_hardware("h200", "1.5TB")
    cpu, gpu = estimate_zero2_model_states_mem_needs(m.total_params, cpu_offload=True, additional_buffer_factor=1.0)
    for tiled, extra in ((True, 0), (False, 2)):
        r = plan_zero3(m, hw, Zero3Policy(batch=1, seq=512, offload_param=False, adam_copies_params=tiled))
        states = sum(r.host.by_role[k] for k in ("master", "moments", "grads", "working_copy"))
        # 16 bytes a parameter; 0.19 also pins a compute-dtype buffer to cast into (stage_1_and_2.py
        # param_buffer_of_bit16_for_cpu_offload_groups), which DeepSpeed's estimate leaves out
        assert states == cpu + extra * m.total_params
        held = sum(b.bytes for b in r.schedule.buffers.values() if b.holds == Holds.DEVICE_PARAMS)
        assert held == gpu  # 2 bytes a parameter on the device


def test_the_device_bound_holds_every_parameter_and_decides_the_fit():
    m = gpt2(64)  # DeepSpeed's 13B (64 x 4096): ZeRO-2 offload trains it on one V100
    hw = make_hardware("v100-32gb", "1.5TB")
    tiled = dict(offload_param=False, adam_copies_params=True)
    r = plan_zero3(m, hw, Zero3Policy(batch=4, seq=1024, **tiled))
    bound = device_peak_bound(r.schedule)
    static = r.schedule.static_bytes(Space.DEVICE)
    assert static >= 2 * m.total_params and bound >= static
    assert r.summary.device_peak_bytes >= bound  # the verdict's peak: the bound and the library workspace
    assert r.device_trace.bytes.max() <= r.summary.device_peak_bytes
    assert r.summary.fits, r.summary.why
    big = plan_zero3(m, hw, Zero3Policy(batch=8, seq=1024, **tiled))
    assert not big.summary.fits and "device" in big.summary.why
    assert not plan_zero3(gpt2(100), hw, Zero3Policy(batch=1, seq=1024, **tiled)).summary.fits  # 20B of parameters
    assert plan_zero3(m, hw, Zero3Policy(batch=8, seq=1024)).summary.fits  # ZeRO-3 offloads them


def test_the_v100_computes_at_the_rate_its_log_gives():
    """The v100-32gb preset's GEMM rate is the one at which the planner's ZeRO-2 step of the
    ZeRO-Offload tutorial's run computes for the logged forward + backward."""
    r = plan_zero3(gpt2(50), make_hardware("v100-32gb", "1.5TB"),
                   Zero3Policy(batch=10, seq=1024, offload_param=False, adam_copies_params=True))
    tl = r.timeline
    compute = tl[tl.lane == "compute"].dur_s.sum()
    assert compute == pytest.approx(V100_TUTORIAL_FORWARD_S + V100_TUTORIAL_BACKWARD_S, rel=0.01)
    assert 0.35 < V100_MEGATRON_TFLOPs / 125.0 < 0.45
    # the rest of the logged 25.8 s step: the Adam (the host's DeepSpeedCPUAdam rate), nothing else exposed
    opt = tl[tl.kind == "optimizer"].dur_s.sum()
    assert r.summary.step_time_s == pytest.approx(compute + opt, rel=0.03)


def test_knobs_of_the_other_stage_are_refused_in_one_line(capsys):
    with pytest.raises(HorizonError, match="zero2-offload keeps every parameter on the device: prefetch_bucket_params"):
        zero2(prefetch_bucket_params=10)
    with pytest.raises(HorizonError, match="adam_copies_params=true is ZeRO-2 offload's"):
        Zero3Policy(adam_copies_params=True)
    with pytest.raises(HorizonError, match="compare with zero3-offload instead of zero2-offload"):
        zero2_like(Policy(batch=2, seq=64), offload_param=True)
    with pytest.raises(HorizonError, match="planned on a GPU only"):
        build_zero3_schedule(small(), zero2(), synchronous=True)
    base = ["plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--ram", "256GiB", "--no-advice"]
    for knobs, says in (("offload_param=on", "compare with zero3-offload"), ("hook_us=10", "hook_us")):
        assert main(base + ["--compare", "zero2-offload", "--peer-knobs", knobs]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "\n" not in err and "Traceback" not in err, err
    assert main(base + ["--compare", "zero3-offload", "--peer-knobs", "offload_param=off"]) == 2
    assert "compare with zero2-offload" in capsys.readouterr().err


def test_ds_config_is_stage_2_with_the_optimizer_offloaded():
    cfg = zero2(reduce_bucket_params=123, overlap_comm=False).ds_config()["zero_optimization"]
    assert cfg["stage"] == 2 and cfg["offload_optimizer"]["device"] == "cpu" and "offload_param" not in cfg
    assert (cfg["reduce_bucket_size"], cfg["overlap_comm"]) == (123, False)
    assert Zero3Policy().ds_config()["zero_optimization"]["stage"] == 3


def test_plan_compare_names_the_zero2_peer(capsys):
    argv = ["plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--ram", "256GiB", "--no-advice",
            "--compare", "zero2-offload"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Horizon against DeepSpeed ZeRO-2 offload (activation checkpointing on, parameters on the device" in out
    assert main(argv + ["--json"]) == 0
    c = json.loads(capsys.readouterr().out)["compare"]
    assert c["peer"] == "zero2-offload" and c["peer_policy"]["offload_param"] is False
    fam = peer("zero2-offload")
    assert fam.like(Policy(batch=2, seq=64)).offload_param is False and "adam_copies_params" in fam.knobs


def test_validate_runs_only_the_zero3_peer_for_real(capsys):
    with pytest.raises(SystemExit) as e:
        main(["validate", "--peer", "zero2-offload"])
    assert e.value.code == 2 and "invalid choice: 'zero2-offload'" in capsys.readouterr().err
