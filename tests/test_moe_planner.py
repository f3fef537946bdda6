"""Issue 28: the planner knows an MoE model's active from its total parameters. Host and link
bytes come from every expert (all cross the link each pass); compute from the active ones (the
router, k experts' GEMMs over the routed rows, dispatch and combine); MFU counts active
parameters; plan, tune, min-ram, max-model --moe and sweep run on MoE models and agree with plan."""
import argparse
import json
from dataclasses import replace

import pytest

from horizon_sim.cli import max_model_cmd, min_ram_cmd, sweep_cmd, tune_cmd
from horizon_sim.cli.main import main
from horizon_sim.plan import plan
from horizon_sim.schedule import kernel_bytes, work
from horizon_sim.schedule.expert_load import expert_rows, max_rows
from horizon_sim.schedule.op import Lane
from horizon_sim.specs import block
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import PRESETS
from horizon_sim.specs.policy import Policy

POLICY = Policy(batch=2, seq=256)


def _moe(experts: int, top_k: int = 2) -> ModelSpec:
    return ModelSpec(name=f"moe-e{experts}", n_layers=4, hidden=512, n_heads=8, n_kv_heads=2, head_dim=64,
                     ffn_hidden=1024, vocab=2048, family="qwen3_moe", n_experts=experts,
                     experts_per_token=top_k, expert_ffn_hidden=256, norm_topk_prob=True)


def _h2d_bytes(r) -> int:
    return sum(op.link_bytes for op in r.schedule.ops if op.lane == Lane.H2D)


def _gemm_flops(m: ModelSpec, tokens: int, backward: bool) -> float:
    return sum(g.flops for g in work.block_gemms(m, tokens, backward))


def test_expert_rows_add_up_and_the_hottest_expert_is_above_the_mean():
    for tokens, k, e in ((8192, 8, 128), (512, 2, 8), (3, 2, 8), (4096, 1, 64)):
        groups = expert_rows(tokens, k, e)
        # every expert runs a GEMM, but for the ones no row reaches (3 tokens x 2 over 8 experts)
        assert sum(c for _, c in groups) == min(e, tokens * k - max_rows(tokens, k, e) + 1)
        assert sum(r * c for r, c in groups) == tokens * k  # FLOPs exact whatever the skew
        assert tokens * k / e <= max_rows(tokens, k, e) <= tokens
    # 8192 tokens x 8 / 128 = 512 rows on average; the hottest expert: 512 + sqrt(2 512 ln 128) = 512 + 70.5
    assert max_rows(8192, 8, 128) == 583
    assert expert_rows(8192, 8, 128, spread=0.0) == ((512, 1), (512, 127))


def test_block_gemms_count_active_work_only():
    """Doubling the experts at fixed top-k leaves the GEMM FLOPs (and the op's model FLOPs)
    equal up to the router's E-wide GEMM; they equal 2 x tokens x active matmul weights."""
    tokens = POLICY.micro_batch * POLICY.seq
    small, big = _moe(8), _moe(16)
    for m in (small, big):
        assert _gemm_flops(m, tokens, False) == 2.0 * tokens * m.layer_active_matmul_params
        assert _gemm_flops(m, tokens, True) == 3 * _gemm_flops(m, tokens, False)
    router_delta = 2.0 * tokens * 512 * 8
    assert _gemm_flops(big, tokens, False) - _gemm_flops(small, tokens, False) == router_delta
    # while the parameters grow by the 8 extra experts and their router rows
    assert big.layer_params - small.layer_params == 8 * (3 * 512 * 256 + 512)


def test_host_and_link_bytes_grow_with_the_experts_compute_does_not():
    hw = make_hardware("h100-pcie", "64GiB")
    r8, r16 = plan(_moe(8), hw, POLICY), plan(_moe(16), hw, POLICY)
    m8, m16 = _moe(8), _moe(16)
    # every expert crosses the link: the loads grow with the block's total parameters
    assert _h2d_bytes(r16) > _h2d_bytes(r8) + 4 * 2 * (m16.layer_params - m8.layer_params)
    assert r16.summary.host_bytes > r8.summary.host_bytes + 12 * (m16.total_params - m8.total_params)
    # compute: the ops' FLOPs differ by the router's E columns alone
    fwd = lambda r: sum(op.flops for op in r.schedule.ops if op.kind.value == "forward")
    tokens = POLICY.micro_batch * POLICY.seq
    assert fwd(r16) - fwd(r8) == pytest.approx(4 * 2.0 * tokens * 512 * 8)


def test_mfu_counts_active_parameters():
    m = PRESETS["qwen3-30b-a3b"]
    r = plan(m, make_hardware("h100-pcie", "512GiB"), POLICY)
    s = r.summary
    tokens = POLICY.batch * POLICY.seq
    want = tokens * m.model_flops_per_token(POLICY.seq) / s.step_time_s / 1e12
    assert s.model_TFLOPs == pytest.approx(want, rel=1e-9)
    assert m.model_flops_params < 0.11 * m.total_params  # 3.04B of 30.5B: MFU on the total would be 10x
    assert 6.0 * m.model_flops_params == pytest.approx(m.model_flops_per_token(POLICY.seq)
                                                       - 12.0 * m.q_dim * m.n_layers * POLICY.seq)


def test_moe_kernels_have_byte_counts_and_temporaries():
    m = PRESETS["qwen3-30b-a3b"]
    kinds = {k.kind for k in block.kernels(m)}
    assert {"router", "dispatch", "combine"} <= kinds
    for k in block.kernels(m):
        assert kernel_bytes.forward_bytes(k, 2) >= 0 and kernel_bytes.backward_bytes(k, 2) >= 0
    assert work.block_elementwise_bytes(m, 4096, 2048, 2, True) > work.block_elementwise_bytes(m, 4096, 2048, 2, False)
    # the backward's temporaries hold every expert's weight gradient (autograd.grad returns them together)
    assert work.block_temp_peak_bytes(m, 2, 2048, 2, True) > m.layer_params * 2


def test_the_router_aux_loss_is_priced_at_the_router():
    """With the load-balancing loss on, a router reads its fp32 probabilities once more forward
    (4 E bytes a token, summed per expert) and adds that sum's gradient into theirs backward
    (8 E); a backward also runs the forward again. Host and device memory do not change, and
    the step is a little slower, not faster."""
    m, E, N = _moe(8), 8, 4096
    on = replace(m, router_aux_loss_coef=0.01)
    fwd = work.block_elementwise_bytes(on, N, 256, 2, False) - work.block_elementwise_bytes(m, N, 256, 2, False)
    bwd = work.block_elementwise_bytes(on, N, 256, 2, True) - work.block_elementwise_bytes(m, N, 256, 2, True)
    assert (fwd, bwd) == (N * 4 * E, N * (4 + 8) * E)
    hw = make_hardware("h100-pcie", "64GiB")
    off_plan, on_plan = plan(m, hw, POLICY).summary, plan(on, hw, POLICY).summary
    assert on_plan.host_bytes == off_plan.host_bytes
    assert off_plan.tokens_per_s >= on_plan.tokens_per_s > 0.99 * off_plan.tokens_per_s


def test_qwen2_moe_shared_expert_is_priced():
    d = dict(n_layers=2, hidden=256, n_heads=4, n_kv_heads=4, ffn_hidden=512, vocab=512, qkv_bias=True,
             family="qwen2_moe", n_experts=8, experts_per_token=2, expert_ffn_hidden=128)
    with_shared = ModelSpec(**d, shared_expert_ffn_hidden=512)
    tokens = 512
    shared_weights = 3 * 256 * 512 + 256
    assert with_shared.layer_active_matmul_params == (
        sum(p.active_params(2) for p in block.projections(with_shared) if "shared" not in p.module) + shared_weights)
    assert {"gate_mul"} <= {k.kind for k in block.kernels(with_shared)}
    assert plan(with_shared, make_hardware("h100-pcie", "64GiB"), POLICY).summary.fits
    assert _gemm_flops(with_shared, tokens, False) == 2.0 * tokens * with_shared.layer_active_matmul_params


# ---- the CLI verbs ---------------------------------------------------------------------------
def _parse(mod, argv):
    p = argparse.ArgumentParser()
    mod.configure(p)
    return p.parse_args(argv)


def _run(mod, argv, capsys):
    rc = mod.run(_parse(mod, argv))
    return rc, capsys.readouterr().out


def _config(tmp_path, m: ModelSpec) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(to_hf_config_dict(m)))
    return str(p)


def test_cli_plan_on_an_moe_preset(capsys):
    rc = main(["plan", "--model", "qwen3-30b-a3b", "--gpu", "rtx-4090", "--ram", "512GB", "--no-advice"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "qwen3-30b-a3b (30.53B params, 3.35B active (MFU counts active))" in out and "tokens/s" in out


def test_cli_bad_moe_config_is_a_one_line_error(tmp_path, capsys):
    d = to_hf_config_dict(_moe(8))
    d["decoder_sparse_step"] = 2
    (tmp_path / "config.json").write_text(json.dumps(d))
    rc = main(["plan", "--model", str(tmp_path / "config.json"), "--gpu", "h100-pcie"])
    err = capsys.readouterr().err
    assert rc == 2 and "decoder_sparse_step = 2" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    rc = main(["plan", "--model", str(_deepseek(tmp_path)), "--gpu", "h100-pcie"])
    err = capsys.readouterr().err
    assert rc == 2 and "deepseek_v32" in err and len(err.strip().splitlines()) == 1


def _deepseek(tmp_path):
    p = tmp_path / "ds" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps({"model_type": "deepseek_v32", "hidden_size": 7168}))
    return p


def test_tune_min_ram_and_sweep_agree_with_plan(tmp_path, capsys):
    m = _moe(16)
    cfg = _config(tmp_path, m)
    hw = make_hardware("h100-pcie", "64GiB")
    rc, out = _run(tune_cmd, ["--model", cfg, "--gpu", "h100-pcie", "--ram", "64GiB", "--seq", "256",
                              "--max-batch", "4", "--workers", "1", "--quiet", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["fits"]
    best = Policy(**d["best_policy"])
    assert d["best"]["tokens_per_s"] == pytest.approx(plan(m, hw, best).summary.tokens_per_s, rel=1e-9)

    rc, out = _run(min_ram_cmd, ["--model", cfg, "--gpu", "h100-pcie", "--seq", "256", "--batch", "2", "--json"],
                   capsys)
    d = json.loads(out)
    assert rc == 0 and d["fits"]
    at = plan(m, make_hardware("h100-pcie", d["ram_bytes"]), Policy(**d["policy"]))
    assert at.summary.fits and at.summary.tokens_per_s == pytest.approx(d["tokens_per_s"], rel=1e-9)

    grid = tmp_path / "grid.toml"
    grid.write_text(f'models = ["{cfg}"]\ngpus = ["h100-pcie"]\nram = ["64GiB"]\n[policy]\nseq = [256]\nbatch = [2]\n')
    rc, out = _run(sweep_cmd, [str(grid), "-o", str(tmp_path / "r.csv"), "--workers", "1", "--quiet", "--json",
                               "--no-plot"], capsys)
    assert rc == 0
    import pandas as pd
    row = pd.read_csv(tmp_path / "r.csv").iloc[0]
    assert row["tokens_per_s"] == pytest.approx(plan(m, hw, POLICY).summary.tokens_per_s, rel=1e-9)


def test_max_model_moe_answers_with_an_moe_model(capsys):
    rc, out = _run(max_model_cmd, ["--gpu", "h100-pcie", "--ram", "512GiB", "--seq", "512", "--workers", "1",
                                   "--quiet", "--policies", "default", "--moe", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["family"] in ("preset", "moe-depth")
    m = ModelSpec(**d["shape"])
    assert m.is_moe and m.family == "qwen3_moe"
    assert plan(m, make_hardware("h100-pcie", "512GiB"), Policy(**d["policy_fields"])).summary.fits


def test_an_moe_block_pays_its_routers_and_each_experts_fixed_cost():
    """op_overhead_us's '<kind>_router' once per op and '<kind>_expert' per expert the loop runs
    (calibrate measures them, calibrate/overheads.py moe_overheads): every expert when the op
    routes as many rows, fewer when it routes fewer; a dense block pays neither."""
    from horizon_sim.schedule import OpKind, build_schedule
    from horizon_sim.sim.costs import CostModel
    from tests.cpu_machine import CPU_HW
    table = (("forward", 3000.0), ("backward", 9000.0), ("forward_router", 500.0), ("forward_expert", 100.0),
             ("backward_router", 700.0), ("backward_expert", 300.0))
    hw = replace(CPU_HW, device=replace(CPU_HW.device, op_overhead_us=table))

    def overhead_us(m, pol, kind):
        sched = build_schedule(m, pol)
        op = next(o for o in sched.ops if o.kind == kind)
        return CostModel(hw, "bf16", sched.meta).compute_terms(op)["overhead"] * 1e6

    m = _moe(16)
    assert overhead_us(m, POLICY, OpKind.FORWARD) == pytest.approx(3000 + 500 + 16 * 100)
    assert overhead_us(m, POLICY, OpKind.BACKWARD) == pytest.approx(9000 + 700 + 16 * 300)
    few = Policy(batch=1, seq=4)  # 4 tokens x top-2: at most 8 experts get rows
    assert overhead_us(m, few, OpKind.BACKWARD) == pytest.approx(9000 + 700 + 8 * 300)
    dense = ModelSpec(n_layers=4, hidden=512, n_heads=8, n_kv_heads=2, ffn_hidden=1024, vocab=2048)
    assert overhead_us(dense, POLICY, OpKind.BACKWARD) == pytest.approx(9000)
