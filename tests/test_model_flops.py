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
    """DESIGN.md 'Honest metrics': 6·N + 12·L·H·T, N = block matmul weights + LM head."""
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


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_layer_and_head_flops_meta(name):
    """One real decoder layer and the real head of every preset, on the meta device (shapes only,
    so a 405B layer at seq 2048 costs nothing): forward FLOPs equal layer_fwd_flops /
    head_fwd_flops, forward+backward is 3x forward, and L layers + head give exactly
    model_flops_per_token per trained token."""
    spec = PRESETS[name]
    B, T = 1, 2048
    tokens = B * T
    with torch.device("meta"):
        model = _model(replace(spec, n_layers=1), "meta")  # layers are identical: build one
        layer, head_norm, lm_head = model.model.layers[0], model.model.norm, model.lm_head
        x = torch.empty(B, T, spec.hidden, requires_grad=True)  # (B, T, H)
        pe = model.model.rotary_emb(x, torch.arange(T)[None])

        fwd = _count(lambda: layer(x, attention_mask=None, position_embeddings=pe))
        assert fwd == spec.layer_fwd_flops(tokens, T, causal=False)
        layer_fb = _count(lambda: layer(x, attention_mask=None, position_embeddings=pe).sum().backward())
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
              vocab=300, qkv_bias=True, tied_embeddings=True),
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
