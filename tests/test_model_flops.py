"""ModelSpec FLOPs checked against torch's FlopCounterMode running the real transformers model,
and the activation-byte formulas' shape (what depends on seq, what does not).

FlopCounterMode counts matmuls only (mm/addmm/bmm; a bias add is free) and counts the full
T x T attention matmuls of eager attention, so comparisons use causal=False. It does not count
CPU sdpa kernels, hence attn_implementation="eager" throughout.
"""
from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig, AutoModelForCausalLM

from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec
from horizon_exec.model.families import FORWARDS
from horizon_sim.specs.model_presets import PRESETS, model_preset


def _model(spec: ModelSpec, device: str):
    d = to_hf_config_dict(spec)
    cfg = AutoConfig.for_model(d.pop("model_type"), attn_implementation="eager", **d)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg)


def _count(fn) -> int:
    fc = FlopCounterMode(display=False)
    with fc:
        fn()
    return fc.get_total_flops()


def test_palm_formula_by_hand_llama2_7b():
    """docs/architecture.md 'Honest metrics': 6·N + 12·L·H·T, N = block matmul weights + LM head
    (PaLM: Chowdhery et al. 2022, arXiv 2204.02311, Appendix B, model FLOPs utilization).
    Llama-2-7B's shape (L 32, H 4096, F 11008, V 32000) is its published config.json."""
    s = model_preset("llama-2-7b")
    L, H, F, V, T = 32, 4096, 11008, 32000, 2048
    N = L * (4 * H * H + 3 * H * F) + V * H  # q,k,v,o + gate,up,down per block; LM head
    assert N == 6_607_077_376 == s.model_flops_params
    assert s.model_flops_per_token(T) == 6 * N + 12 * L * H * T == 42_863_689_728
    # The embedding is a lookup, not a matmul: N is the published total minus the embedding
    # and the norms.
    assert N == 6_738_415_616 - V * H - (2 * L + 1) * H


def test_causal_halves_attention_only():
    s = model_preset("llama-3.1-8b")
    tokens, T = 4096, 2048
    full, causal = s.layer_fwd_flops(tokens, T, causal=False), s.layer_fwd_flops(tokens, T)
    matmul = 2 * s.layer_matmul_params * tokens
    assert full - matmul == 4 * T * s.q_dim * tokens
    assert causal - matmul == 2 * T * s.q_dim * tokens
    assert s.head_fwd_flops(tokens) == 2 * s.vocab * s.hidden * tokens


@pytest.mark.parametrize("name", [n for n, s in PRESETS.items() if not s.is_moe and s.family in FORWARDS])
def test_preset_layer_and_head_flops_meta(name):
    """One real decoder layer and the real head of every dense preset, on the meta device (shapes
    only, so a 405B layer at seq 2048 costs nothing): forward FLOPs equal layer_fwd_flops /
    head_fwd_flops, forward+backward is 3x forward, and L layers + head give exactly
    model_flops_per_token per trained token. (An MoE layer's FLOPs follow its router, which
    meta tensors do not run; tests/test_moe_planner.py checks the active counts. Planned-only
    families' layers take other arguments and are left out.)"""
    spec = replace(PRESETS[name], layer_windows=())  # full attention: the layer below runs without a mask
    B, T = 1, 2048
    tokens = B * T
    with torch.device("meta"):
        model = _model(replace(spec, n_layers=1), "meta")  # layers are identical: build one
        base = model.base_model  # model.model, or GPT-NeoX's gpt_neox, GPT-2's transformer
        layer = (base.h if hasattr(base, "h") else base.layers)[0]
        lm_head = model.get_output_embeddings()
        head_norm = next(getattr(base, n) for n in ("norm", "final_layer_norm", "ln_f") if hasattr(base, n))
        x = torch.empty(B, T, spec.hidden, requires_grad=True)  # (B, T, H)
        kw = {}
        if hasattr(base, "rotary_emb"):  # Gemma 3's takes the layer type (one table per RoPE base); GPT-2 has none
            kw["position_embeddings"] = base.rotary_emb(x, torch.arange(T)[None],
                                                        *(["full_attention"] if spec.rope_table_count > 1 else []))

        def run():
            out = layer(x, attention_mask=None, **kw)
            return out[0] if isinstance(out, tuple) else out

        fwd = _count(run)
        assert fwd == spec.layer_fwd_flops(tokens, T, causal=False)
        layer_fb = _count(lambda: run().sum().backward())
        assert layer_fb == 3 * fwd

        head_fwd = _count(lambda: lm_head(head_norm(x)))
        assert head_fwd == spec.head_fwd_flops(tokens)
        head_fb = _count(lambda: lm_head(head_norm(x)).float().sum().backward())
        assert head_fb == 3 * head_fwd

    assert spec.n_layers * layer_fb + head_fb == tokens * spec.model_flops_per_token(T)


@pytest.mark.parametrize("spec", [
    # GQA with an explicit head_dim != hidden // heads, so q_dim (160) != hidden (96)
    ModelSpec(name="llama-gqa-hd", n_layers=2, hidden=96, n_heads=4, n_kv_heads=2, head_dim=40,
              ffn_hidden=200, vocab=300),
    # Qwen2-style: q/k/v biases, tied embeddings
    ModelSpec(name="qwen2-tied", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=160,
              vocab=300, family="qwen2", tied_embeddings=True),
], ids=lambda s: s.name)
def test_real_training_step_flops_cpu(spec):
    """A whole tiny model, for real on the CPU: forward (with HF's own causal mask), loss and
    backward count exactly tokens * model_flops_per_token(seq) (PaLM, non-causal)."""
    torch.manual_seed(0)
    model = _model(spec, "cpu")
    B, T = 2, 24
    ids = torch.randint(0, spec.vocab, (B, T))
    flops = _count(lambda: model(input_ids=ids, labels=ids, use_cache=False).loss.backward())
    assert flops == B * T * spec.model_flops_per_token(T)
    fwd = _count(lambda: model(input_ids=ids, use_cache=False))
    assert fwd == spec.n_layers * spec.layer_fwd_flops(B * T, T, causal=False) + spec.head_fwd_flops(B * T)


# ---- sliding windows and document masks ---------------------------------------------------------

def test_model_flops_count_what_a_query_can_attend_to():
    """PaLM's attention term 12·H·T per layer uses the window when it is shorter than the
    sequence, and the mean document under document masks."""
    s = model_preset("mistral-7b")
    L, q, T = s.n_layers, s.q_dim, 8192
    win = replace(s, layer_windows=(4096,) * L)
    assert s.model_flops_per_token(T) - win.model_flops_per_token(T) == 12 * q * L * (T - 4096)
    assert win.model_flops_per_token(2048) == s.model_flops_per_token(2048)      # window >= seq: no change
    half = replace(s, layer_windows=(0, 1024) * (L // 2))                          # every other layer
    assert s.model_flops_per_token(T) - half.model_flops_per_token(T) == 12 * q * (L // 2) * (T - 1024)
    assert s.model_flops_per_token(T, context=512) == 6 * s.model_flops_params + 12 * q * L * 512
    assert win.model_flops_per_token(T, context=6000) == 6 * s.model_flops_params + 12 * q * L * 4096


def test_schedule_prices_masked_attention_and_its_temporaries():
    """A windowed layer runs the kernel under an explicit mask: every T x T score (twice the
    causal count) and the mask as a temporary; the schedule's model FLOPs count the window."""
    from horizon_sim.schedule import OpKind, build_schedule
    from horizon_sim.specs.policy import Policy
    base = ModelSpec(n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=640, vocab=256)
    win = replace(base, layer_windows=(0, 64))           # layer 1 windowed, layer 0 full
    pol = Policy(batch=2, seq=512)
    ops = {(o.kind, o.unit): o for o in build_schedule(win, pol).ops if o.micro == 0}
    plain = {(o.kind, o.unit): o for o in build_schedule(base, pol).ops if o.micro == 0}
    tok = pol.batch * pol.seq
    assert ops[OpKind.FORWARD, 0].flops == plain[OpKind.FORWARD, 0].flops
    assert ops[OpKind.FORWARD, 1].flops - plain[OpKind.FORWARD, 1].flops == 2 * pol.seq * base.q_dim * tok
    assert ops[OpKind.BACKWARD, 1].workspace_bytes > plain[OpKind.BACKWARD, 1].workspace_bytes
    assert ops[OpKind.BACKWARD, 0].workspace_bytes == plain[OpKind.BACKWARD, 0].workspace_bytes
    sw, sp = build_schedule(win, pol), build_schedule(base, pol)
    assert sp.meta.model_flops - sw.meta.model_flops == 12 * base.q_dim * (512 - 64) * tok
    docs = build_schedule(base, replace(pol, doc_masks=True, doc_tokens=128))
    assert all(o.flops == ops[OpKind.FORWARD, 1].flops for o in docs.ops if o.kind == OpKind.FORWARD)
    assert docs.meta.model_flops == tok * base.model_flops_per_token(512, context=128)


def test_plan_of_a_windowed_model_is_cheaper_in_model_flops_and_dearer_per_step():
    """The planner end to end: the window lowers model FLOPs per token (useful work) and the
    masked kernel raises the step's attention time."""
    from horizon_sim.plan import plan
    from horizon_sim.specs.policy import Policy
    s = model_preset("mistral-7b")
    win = replace(s, layer_windows=(1024,) * s.n_layers)
    a = plan(s, policy=Policy(batch=1, seq=8192), gpu="h100-pcie", ram="512GiB")
    b = plan(win, policy=Policy(batch=1, seq=8192), gpu="h100-pcie", ram="512GiB")
    assert b.schedule.meta.model_flops < a.schedule.meta.model_flops
    assert b.summary.step_time_s > a.summary.step_time_s
