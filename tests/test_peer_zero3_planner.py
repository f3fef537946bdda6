"""The ZeRO-3-offload peer's Schedule (horizon_sim/peer): it is a valid Schedule the simulator runs,
its host model states follow DeepSpeed's own arithmetic, its knobs change the step the way
DeepSpeed's do, and `horizon plan --compare` shows both plans. Planner only, no clocks."""
import json

import pytest

from horizon_sim.cli.main import main
from horizon_sim.peer.compare import parse_knobs, plan_zero3, zero3_like
from horizon_sim.peer.zero3_builder import build_zero3_schedule
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule.op import EMBED, Holds, Lane, OpKind
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy


def small(L=4, H=256, V=512):
    return ModelSpec(name=f"s{L}", n_layers=L, hidden=H, n_heads=4, n_kv_heads=2, ffn_hidden=688, vocab=V)


@pytest.mark.parametrize("kw", [dict(), dict(act_ckpt=False), dict(micro_batches=2, batch=4),
                                dict(compute_dtype="fp32", grad_clip=0.0), dict(overlap_comm=False),
                                dict(max_reuse_distance_params=1, prefetch_bucket_params=1000)])
def test_the_peer_step_is_a_checked_schedule_the_simulator_runs(kw):
    zero3 = Zero3Policy(**{"batch": 2, "seq": 64, **kw})
    s = build_zero3_schedule(small(), zero3)  # .check(): hazards, balance, typed buffers
    r = simulate(s, make_hardware("a100-80gb", "256GiB"))
    assert r.summary.step_time_s > 0 and r.summary.device_peak_bytes > 0
    kinds = [op.kind for op in s.ops]
    # every unit's optimizer runs once, after the last backward: nothing overlaps it
    last_bwd = max(i for i, k in enumerate(kinds) if k in (OpKind.BACKWARD, OpKind.BACKWARD_SAVED))
    opt = [op for op in s.ops if op.kind == OpKind.OPTIMIZER]
    assert sorted(op.unit for op in opt) == [EMBED, *range(4), 4]
    tl = r.timeline
    compute_end = tl[tl.lane == "compute"].end_s.max()
    assert tl[tl.kind == "optimizer"].start_s.min() >= compute_end - 1e-12
    assert all(op.id > last_bwd for op in opt)
    bwd = OpKind.BACKWARD_SAVED if kw.get("act_ckpt") is False else OpKind.BACKWARD
    assert kinds.count(bwd) == 4 * zero3.micro_batches


def test_host_model_states_follow_deepspeeds_own_arithmetic():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    for name in ("llama-3.1-8b", "qwen2.5-32b"):
        m = model_preset(name)
        r = plan_zero3(m, make_hardware("h200", "1.5TB"), Zero3Policy(batch=1, seq=512))
        states = sum(r.host.by_role[k] for k in ("master", "moments", "grads", "working_copy"))
        largest = max(m.layer_params, m.embedding_params, m.head_device_params)
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            m.total_params, largest, num_gpus_per_node=1, num_nodes=1, cpu_offload=True, cpu_offload_params=True,
            zero_init=True, additional_buffer_factor=1.0)
        assert states == pytest.approx(cpu, rel=1e-9), name  # 18 bytes a parameter
        assert states == 18 * m.total_params


def test_knobs_change_the_step_as_deepspeeds_do():
    m, hw = small(L=8), make_hardware("a100-80gb", "256GiB")
    base = dict(batch=2, seq=128)
    ck, nock = (simulate(build_zero3_schedule(m, Zero3Policy(**base, act_ckpt=c)), hw) for c in (True, False))
    # without checkpointing autograd keeps every layer's saved tensors: more device memory, no recompute
    assert nock.summary.device_peak_bytes > ck.summary.device_peak_bytes
    flops = [sum(op.flops for op in r.schedule.ops if op.lane == Lane.COMPUTE) for r in (ck, nock)]
    assert flops[1] < flops[0]

    def backward_loads(z):
        s = build_zero3_schedule(m, z)
        first_bwd = next(op.id for op in s.ops if op.kind in (OpKind.BACKWARD, OpKind.BACKWARD_SAVED))
        return sum(1 for op in s.ops if op.kind == OpKind.LOAD_WEIGHTS and op.id > first_bwd and op.unit != EMBED)
    # a small model within the reuse distance keeps its layers; a short distance fetches them again
    # (the embedding's weight comes back for its backward at any distance: its pre-backward hook)
    assert backward_loads(Zero3Policy(**base)) == 0
    assert backward_loads(Zero3Policy(**base, max_reuse_distance_params=1)) >= 7
    # buckets: one offload per unit with a tiny bucket, a single one with DeepSpeed's default
    offloads = lambda z: sum(op.kind == OpKind.OFFLOAD_GRADS for op in build_zero3_schedule(m, z).ops)  # noqa: E731
    assert offloads(Zero3Policy(**base)) == 1 and offloads(Zero3Policy(**base, reduce_bucket_params=1)) == 10
    # gradients leave as fp32: 4 bytes a parameter over the link; DeepSpeed's partition_grads takes
    # them down and back up in the model's dtype (bf16: 2 bytes; engine.py get_data_types) and (one
    # micro-batch: at the boundary) down again as fp32
    for fp32_copy, down, up in ((False, 4, 0), (True, 2 + 4, 2)):
        s = build_zero3_schedule(m, Zero3Policy(**base, fp32_grad_copy=fp32_copy))
        grads = sum(b.numel for b in s.buffers.values() if b.holds == Holds.DEVICE_GRAD)
        assert sum(op.link_bytes for op in s.ops if op.kind == OpKind.OFFLOAD_GRADS) == down * grads
        assert sum(op.link_bytes for op in s.ops if op.kind == OpKind.RELOAD_GRADS) == up * grads
    # pageable gradient buffers: their copies at the link's pageable rate
    slow = plan_zero3(m, hw, Zero3Policy(**base, pin_memory=False))
    assert slow.summary.step_time_s > ck.summary.step_time_s


def test_the_ds_config_says_what_the_policy_says():
    z = Zero3Policy(batch=8, seq=256, micro_batches=2, act_ckpt=False, reduce_bucket_params=123, pin_memory=False)
    c = z.ds_config()
    zo = c["zero_optimization"]
    assert c["train_micro_batch_size_per_gpu"] == 4 and c["gradient_accumulation_steps"] == 2
    assert zo["stage"] == 3 and zo["offload_param"] == {"device": "cpu", "pin_memory": False}
    assert zo["offload_optimizer"]["device"] == "cpu" and zo["reduce_bucket_size"] == 123
    assert c["bf16"]["enabled"] is True


def test_zero3_like_keeps_the_batch_and_knobs_parse():
    knobs = parse_knobs("act_ckpt=off,reduce_bucket_params=2e8")
    z = zero3_like(Policy(batch=8, seq=1024, micro_batches=2, grad_clip=0.5), **knobs)
    assert (z.batch, z.seq, z.micro_batches, z.grad_clip, z.act_ckpt, z.reduce_bucket_params) == (
        8, 1024, 2, 0.5, False, 200_000_000)


def test_plan_compare_prints_both_plans_and_json(capsys):
    argv = ["plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--ram", "256GiB", "--no-advice"]
    assert main(argv + ["--compare", "zero3-offload"]) == 0
    out = capsys.readouterr().out
    assert "ZeRO-3 offload" in out and "tokens/s" in out and "why" in out
    assert main(argv + ["--compare", "zero3-offload", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    c = doc["compare"]
    assert c["peer"] == "zero3-offload" and c["speedup"] == pytest.approx(doc["tokens_per_s"] / c["tokens_per_s"])
    assert c["host_bytes"] > 18 * doc["params"]


@pytest.mark.parametrize("extra, says", [
    (["--compare", "zero3-offload", "--peer-knobs", "nosuch=1"], "--peer-knobs 'nosuch=1'"),
    (["--compare", "zero3-offload", "--peer-knobs", "act_ckpt=maybe"], "act_ckpt='maybe'"),
    (["--compare", "zero3-offload", "--peer-knobs", "reduce_bucket_params=0"], "reduce_bucket_params=0"),
    (["--peer-knobs", "act_ckpt=off"], "add --compare zero3-offload"),
    (["--compare", "zero3-offload", "--gpus", "2"], "modelled on one device"),
    (["--compare", "zero4"], "invalid choice"),
])
def test_bad_compare_input_is_one_line_and_exit_2(capsys, extra, says):
    argv = ["plan", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--no-advice"]
    with pytest.raises(SystemExit) if "zero4" in extra else _nothing():
        assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "Traceback" not in err, err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_tune_compare_finds_the_peers_fastest_batch(capsys):
    from horizon_sim.peer.compare import tune_zero3
    m, hw = small(L=4), make_hardware("h100-pcie", "64GiB")
    best, zero3 = tune_zero3(m, hw, 256, max_batch=8)
    rates = {(b, ck): plan_zero3(m, hw, Zero3Policy(batch=b, seq=256, act_ckpt=ck)).summary.tokens_per_s
             for b in (1, 2, 4, 8) for ck in (True, False)}
    assert best.summary.tokens_per_s == max(rates.values()) and rates[zero3.batch, zero3.act_ckpt] == max(rates.values())
    argv = ["tune", "--model", "qwen2.5-0.5b", "--gpu", "h100-pcie", "--ram", "64GiB", "--seq", "512",
            "--max-batch", "4", "--quiet", "--compare", "zero3-offload"]
    assert main(argv + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["compare"]["peer"] == "zero3-offload" and doc["compare"]["peer_policy"]["batch"] <= 4
    assert main(argv[:-2] + ["--peer-knobs", "act_ckpt=off"]) == 2
    assert "add --compare zero3-offload" in capsys.readouterr().err


def test_sweep_compare_adds_the_peer_to_every_row(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text('models = ["tiny", "qwen2.5-0.5b"]\ngpus = ["h100-pcie"]\nram = ["16GiB", "64GiB"]\n'
                    '[policy]\nbatch = [2, 4]\n')
    out = tmp_path / "r.csv"
    assert main(["sweep", str(grid), "-o", str(out), "--no-plot", "--quiet", "--workers", "1",
                 "--compare", "zero3-offload", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    import pandas as pd
    df = pd.read_csv(out)
    assert len(df) == 8 and df.peer_error.isna().all()
    assert (df.speedup - df.tokens_per_s / df.peer_tokens_per_s).abs().max() < 1e-9
    # the same step as plan --compare gives, row by row
    r = df.iloc[-1]
    ref = plan_zero3(model_preset(r.model), make_hardware("h100-pcie", "64GiB"),
                     zero3_like(Policy(batch=int(r.batch), seq=int(r.seq))))
    assert r.peer_tokens_per_s == pytest.approx(ref.summary.tokens_per_s) and bool(r.peer_fits) == ref.summary.fits
    c = doc["compare"]
    assert c["peer_fits"] == int(df.peer_fits.sum()) and c["both"] == int((df.fits & df.peer_fits).sum())


def _peer_peak(model, link_GBps, **kw):
    from dataclasses import replace
    hw = make_hardware("a100-80gb", "256GiB")
    hw = replace(hw, link=replace(hw.link, h2d_GBps=link_GBps, d2h_GBps=link_GBps))
    # no fetched layer kept for its backward; gradients one way only (with fp32_grad_copy their
    # trip back up shares the h2d lane with the fetches, which then throttles the backward too)
    zero3 = Zero3Policy(**{"batch": 1, "seq": 64, "reduce_bucket_params": model.layer_params, "act_ckpt": True,
                        "max_reuse_distance_params": 1, "fp32_grad_copy": False, **kw})
    return simulate(build_zero3_schedule(model, zero3), hw).summary.device_peak_bytes


def test_overlap_comm_keeps_in_flight_gradients_bounded(monkeypatch):
    """With overlap_comm DeepSpeed stalls the backward while more than two bucket offloads are
    outstanding (zero3_builder.MAX_REDUCE_EVENTS): on a link far slower than the backward the
    device holds a few buckets of gradients at any depth, not every layer's. Without the stall
    (the bound lifted) the same step holds the depth's worth."""
    import horizon_sim.peer.zero3_builder as zb
    slow = 0.05  # GB/s: every offload outlasts every backward
    layer = small(L=8).layer_params * 2  # bf16 gradient of one layer (one bucket here)
    p8 = _peer_peak(small(L=8), slow)
    p32 = _peer_peak(small(L=32), slow)
    # act_ckpt keeps each layer's input (seq x hidden bf16, 32 KiB): the rest must not grow
    saved = 64 * 256 * 2
    assert p32 - p8 <= 24 * saved + 2 * layer, (p8, p32)
    monkeypatch.setattr(zb, "MAX_REDUCE_EVENTS", 10**9)
    q32 = _peer_peak(small(L=32), slow)
    assert q32 - p32 > 10 * layer, (p32, q32)  # the pile the bound prevents


def test_the_reduce_bucket_is_a_persistent_device_buffer():
    """DeepSpeed allocates reduce_bucket_size elements for its contiguous gradients once; the
    peer's device peak carries it whatever the model's size."""
    m = small(L=16)  # 12.2M parameters
    for bucket, counted in ((1_000_000, 1_000_000), (10**9, m.total_params)):  # (a bucket above the model: what it fills)
        s = build_zero3_schedule(m, Zero3Policy(batch=1, seq=64, reduce_bucket_params=bucket))
        b = s.buffers["ipg_bucket"]
        assert b.static and b.bytes == counted * 2
    r = simulate(s, make_hardware("a100-80gb", "256GiB"))
    assert r.summary.device_peak_bytes > 2 * m.total_params
