"""The planner's MoE block temporaries (schedule/work.py block_temp_peak_bytes, with the MoE
kernel kinds' estimated bytes of kernel_bytes.py) against what the executor measures (memtrack,
CPU backend: every fresh aten allocation of the op until freed), issue 28.

Seen when this was written (H 128, B 2 x T 128, E 8; planned / measured):
             forward       backward
             bf16  fp32    bf16   fp32
  qwen3_moe  1.10  1.27    1.000  1.000
  mixtral    1.65  1.73    1.000  1.000  (the forward prices one expert's SwiGLU on every token,
                                          which a router may send there; the executor's most
                                          loaded expert had about a third of them)
  qwen2_moe  1.00  1.00    1.002  1.014  (the backward's peak: the forward-with-grad's end, with
                                          the shared expert's output, its gated copy and their
                                          sum; in fp32 the first experts' loop, priced with the
                                          least loaded experts' rows freed)
The bounds below pin those figures, so a change that moves either side far is seen here. (Until
2026-11-29 the forward priced k experts' SwiGLU on every token at once: 1.22-2.34; and missed a
shared expert's tensors on long narrow blocks, tests/test_families.py's "long" shape.)

Since 2026-11-28 the executor pads each expert's rows to a multiple of 16 on a CPU in bf16
(moe_block.py) and the planner prices the most that padding can add (15 rows per expert,
expert_load.py), which on these few tokens per expert lifts the bf16 backward's planned /
measured: qwen3_moe 1.062, mixtral 1.097, qwen2_moe 1.032 (BF16_BACKWARD), and the few-tokens
loop case below to 1.215. fp32 is not padded: its figures stand.
"""
import pytest
import torch

from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import work
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
B, T, H = 2, 128, 128
FAMILIES = {
    "qwen3_moe": dict(family="qwen3_moe", n_experts=8, experts_per_token=2, expert_ffn_hidden=96,
                      ffn_hidden=352, norm_topk_prob=True),
    "mixtral": dict(family="mixtral", n_experts=8, experts_per_token=2, expert_ffn_hidden=352, ffn_hidden=352,
                    norm_topk_prob=True),
    "qwen2_moe": dict(family="qwen2_moe", n_experts=8, experts_per_token=4, expert_ffn_hidden=64,
                      shared_expert_ffn_hidden=256, ffn_hidden=352, qkv_bias=True),
}
# (family, kind): (lowest, highest) planned / measured allowed
BOUNDS = {("qwen3_moe", "forward"): (1.0, 1.3), ("qwen3_moe", "backward"): (1.0, 1.01),
          ("mixtral", "forward"): (1.0, 1.8), ("mixtral", "backward"): (1.0, 1.01),
          ("qwen2_moe", "forward"): (1.0, 1.01), ("qwen2_moe", "backward"): (1.0, 1.025)}
# bf16 backward: the planner counts the experts' padding at its most (15 rows each)
BF16_BACKWARD = {"qwen3_moe": (1.0, 1.08), "mixtral": (1.0, 1.11), "qwen2_moe": (1.0, 1.045)}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_planned_moe_block_temporaries_against_measured(family, dtype):
    spec = ModelSpec(n_layers=2, hidden=H, n_heads=4, n_kv_heads=2, vocab=256, **FAMILIES[family])
    kw = dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False) if dtype == "fp32" else {}
    pol = Policy(batch=B, seq=T, act_ckpt_every=2, loss_chunk_tokens=1024, **kw)
    a = 4 if dtype == "fp32" else 2
    with Trainer(spec, pol) as tr:
        tl = tr.step(torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(0))).timeline
    ratios = {}
    for kind in ("forward", "backward"):
        measured = max(tl[tl.kind == kind].temp_peak_bytes)
        ratios[kind] = work.block_temp_peak_bytes(spec, B, T, a, kind == "backward") / measured
    for kind, r in ratios.items():
        lo, hi = BF16_BACKWARD[family] if (dtype, kind) == ("bf16", "backward") else BOUNDS[family, kind]
        assert lo <= r <= hi, f"{family} {dtype} {kind}: planned / measured = {r:.3f}, pinned in [{lo}, {hi}]"


# Blocks whose backward peaks inside the expert loop rather than at the forward's end (seen:
# planned / measured 1.07 and 1.05, bf16): wide experts on few, well-filled ones (the first
# expert's SwiGLU backward at the most loaded expert's rows) and many experts on few tokens (the
# stack that assembles every expert's weight gradient after the loop). In bf16 the planner adds
# the experts' padding at its most (15 rows each): on few tokens (64 routed rows over 16
# experts) that is most of the rows, so that case's bound is its own.
LOOP_CASES = {
    "wide experts": (dict(hidden=64, n_heads=2, n_kv_heads=1, family="mixtral", n_experts=4, experts_per_token=2,
                          expert_ffn_hidden=1024, ffn_hidden=1024, norm_topk_prob=True), 2, 256),
    "few tokens": (dict(hidden=128, n_heads=4, n_kv_heads=2, family="qwen3_moe", n_experts=16, experts_per_token=2,
                        expert_ffn_hidden=128, ffn_hidden=128), 1, 32),
}


@pytest.mark.parametrize("case", list(LOOP_CASES))
def test_expert_loop_points_bound_the_measured_backward(case):
    kw, b, t = LOOP_CASES[case]
    spec = ModelSpec(n_layers=2, vocab=256, **kw)
    with Trainer(spec, Policy(batch=b, seq=t, act_ckpt_every=2)) as tr:
        tl = tr.step(torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(0))).timeline
    r = work.block_temp_peak_bytes(spec, b, t, 2, True) / max(tl[tl.kind == "backward"].temp_peak_bytes)
    hi = 1.23 if case == "few tokens" else 1.1
    assert 1.0 <= r <= hi, f"{case}: planned / measured = {r:.3f}"
