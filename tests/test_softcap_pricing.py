"""Where the soft-capped attention runs decides how it is priced (sim/costs.py): the CPU
backend runs it in chunks of query rows (softcap_attention.py), whose passes over the scores the
Schedule's hbm_bytes count (work.softcap_elementwise_bytes) and whose FLOPs run at the SDPA
rate; a GPU runs one fused kernel (flex_softcap.py): no score passes, the pairs its window
leaves at the measured softcap_attention_TFLOPs (an H200's, in the GH100 presets)."""
import tomllib
from dataclasses import replace

import pytest

from horizon_sim.schedule import OpKind, build_schedule, work
from horizon_sim.sim.costs import CostModel
from horizon_sim.specs.hardware_presets import DEVICES, make_hardware
from horizon_sim.specs.measured_kernels import H200_FILE
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.cpu_machine import CPU_HW

SEQ, WINDOW = 512, 128
GEMMA2 = ModelSpec(name="tiny-gemma2", family="gemma2", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                   head_dim=128, ffn_hidden=512, vocab=512, norm_eps=1e-6, max_position=SEQ, tied_embeddings=True,
                   padding_idx=0, layer_windows=(WINDOW, 0), attn_softcap=50.0, logit_softcap=30.0, query_scale=128.0)
POLICY = Policy(batch=2, seq=SEQ, act_ckpt_every=1, compute_dtype="bf16")
BLOCK_OPS = (OpKind.FORWARD, OpKind.RECOMPUTE, OpKind.BACKWARD)


def _block_ops():
    sched = build_schedule(GEMMA2, POLICY)
    return sched, [o for o in sched.ops if o.kind in BLOCK_OPS and o.unit in (0, 1) and o.micro == 0]


def _score_passes(op) -> int:
    passes = {OpKind.FORWARD: [False], OpKind.RECOMPUTE: [False], OpKind.BACKWARD: [False, True]}[op.kind]
    return sum(work.softcap_elementwise_bytes(GEMMA2, POLICY.micro_batch, SEQ, 2, bw, GEMMA2.window(op.unit))
               for bw in passes)


def test_the_fused_count_is_the_pairs_the_window_leaves():
    for window in (0, SEQ, 2 * SEQ):  # no window, or one as long as the sequence: the causal count
        assert (work.fused_softcap_attention(GEMMA2, 2, SEQ, True, window)
                == work.attention(GEMMA2, 2, SEQ, True))
    pairs = sum(min(i + 1, WINDOW) for i in range(SEQ))  # each query row sees its last WINDOW keys
    got = work.fused_softcap_attention(GEMMA2, 2, SEQ, False, WINDOW).fwd_flops
    assert got == pytest.approx(2 * 4 * GEMMA2.q_dim * pairs, rel=SEQ ** -1)  # the area rule, to the diagonal


def test_a_gpu_drops_the_chunked_score_passes_and_prices_the_fused_kernel():
    sched, ops = _block_ops()
    hw = make_hardware("h200")
    cm = CostModel(hw, "bf16", sched.meta)
    assert cm.sattn, "the h200 preset carries the measured fused rates"
    for op in ops:
        t = cm.compute_terms(op)
        assert _score_passes(op) > 0
        assert t["elementwise"] * cm.hbm_Bps == pytest.approx(op.hbm_bytes - _score_passes(op))
        backward = op.kind == OpKind.BACKWARD
        attn = work.fused_softcap_attention(GEMMA2, POLICY.micro_batch, SEQ, backward, GEMMA2.window(op.unit))
        at = (float(SEQ), float(GEMMA2.hd))
        want = attn.fwd_flops / (cm.sattn.rate("", at, 0) * 1e12) + attn.bwd_flops / (cm.sattn.rate("", at, 1) * 1e12)
        assert t["attention"] == pytest.approx(want)
    # the sliding layer's attention costs less than the global one's
    fwd = {o.unit: cm.compute_terms(o)["attention"] for o in ops if o.kind == OpKind.FORWARD}
    assert fwd[0] < fwd[1]


def test_the_cpu_backend_prices_the_chunked_kernel_as_scheduled():
    sched, ops = _block_ops()
    cm = CostModel(CPU_HW, "bf16", sched.meta)
    for op in ops:
        t = cm.compute_terms(op)
        assert t["elementwise"] * cm.hbm_Bps == pytest.approx(op.hbm_bytes)
        attn = work.attention(GEMMA2, POLICY.micro_batch, SEQ, op.kind == OpKind.BACKWARD)
        assert t["attention"] == pytest.approx((attn.fwd_flops + attn.bwd_flops) / cm.flops_per_s)


def test_without_a_measured_table_a_gpu_prices_the_fused_kernel_at_the_sdpa_rate():
    sched, ops = _block_ops()
    hw = make_hardware("h200")
    hw = replace(hw, device=replace(hw.device, softcap_attention_TFLOPs=()))
    cm = CostModel(hw, "bf16", sched.meta)
    op = next(o for o in ops if o.kind == OpKind.FORWARD and o.unit == 1)
    attn = work.fused_softcap_attention(GEMMA2, POLICY.micro_batch, SEQ, False)
    assert cm.compute_terms(op)["attention"] == pytest.approx(attn.fwd_flops / (cm.attn.rate("", (SEQ, 128.0), 0) * 1e12))


def test_the_gh100_presets_carry_the_measured_fused_rates():
    rows = tomllib.loads(H200_FILE.read_text())["softcap_attention_TFLOPs"]
    assert [tuple(r) for r in rows] == [tuple(r) for r in DEVICES["h200"].softcap_attention_TFLOPs]
    pcie = DEVICES["h100-pcie"].softcap_attention_TFLOPs
    assert pcie[0][3] == pytest.approx(rows[0][3] * 756 / 989)
    assert not DEVICES["a100-80gb"].softcap_attention_TFLOPs
