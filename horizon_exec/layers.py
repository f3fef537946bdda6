"""Layer templates: a Llama/Qwen2-style decoder block as plain functions of named weights.

The block knows nothing about slots, streams or the host store: the engine binds the weights
(views into a device slot) and calls it. Numerics follow transformers' Llama: RMSNorm in fp32
then cast back before the weight multiply, RoPE with the rotate_half convention and cos/sin in
the activation dtype, causal SDPA with grouped kv heads, SwiGLU MLP, optional q/k/v (Qwen2) and
MLP biases.
"""
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec


def rms_norm(x, w, eps: float):
    """x (..., H), w (H,): HF LlamaRMSNorm (statistics in fp32, output in x's dtype)."""
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dt)


def rope_tables(m: ModelSpec, seq: int, dtype, device):
    """cos, sin (T, hd) for positions 0..T-1, computed in fp32 as HF's default rotary
    embedding does, then cast to the activation dtype."""
    hd = m.hd
    inv_freq = 1.0 / (m.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))
    pos = torch.arange(seq, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)                      # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)                 # (T, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecoderBlock:
    """y = block(w, x, cos, sin) for x (B, T, H); w maps transformers names relative to
    `model.layers.N.` to tensors (see layout.block_layout)."""

    def __init__(self, m: ModelSpec):
        if m.ffn_type != "gated" or m.norm != "rmsnorm":
            raise HorizonError(f"model {m.name!r}: the executor's block template is a gated (SwiGLU) "
                               f"MLP with RMSNorm; {m.ffn_type} MLP with {m.norm} is not supported")
        self.m = m
        self.scale = m.hd ** -0.5

    def __call__(self, w: Mapping, x, cos, sin):
        m = self.m
        B, T, H = x.shape
        nh, nkv, hd = m.n_heads, m.n_kv_heads, m.hd
        # ---- attention ----------------------------------------------------------------
        h = rms_norm(x, w["input_layernorm.weight"], m.norm_eps)            # (B, T, H)
        q = F.linear(h, w["self_attn.q_proj.weight"], w.get("self_attn.q_proj.bias"))
        k = F.linear(h, w["self_attn.k_proj.weight"], w.get("self_attn.k_proj.bias"))
        v = F.linear(h, w["self_attn.v_proj.weight"], w.get("self_attn.v_proj.bias"))
        q = q.view(B, T, nh, hd).transpose(1, 2)                            # (B, nh, T, hd)
        k = k.view(B, T, nkv, hd).transpose(1, 2)                           # (B, nkv, T, hd)
        v = v.view(B, T, nkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                           enable_gqa=nkv != nh)            # (B, nh, T, hd)
        o = o.transpose(1, 2).reshape(B, T, nh * hd)
        x = x + F.linear(o, w["self_attn.o_proj.weight"])
        # ---- MLP ------------------------------------------------------------------------
        h = rms_norm(x, w["post_attention_layernorm.weight"], m.norm_eps)
        g = F.linear(h, w["mlp.gate_proj.weight"], w.get("mlp.gate_proj.bias"))  # (B, T, F)
        u = F.linear(h, w["mlp.up_proj.weight"], w.get("mlp.up_proj.bias"))
        return x + F.linear(F.silu(g) * u, w["mlp.down_proj.weight"], w.get("mlp.down_proj.bias"))
