"""Layer templates: a Llama/Qwen2-style decoder block as plain functions of named weights.

The block knows nothing about slots, streams or the host store: the engine binds the weights
(views into a device slot) and calls it. Numerics follow transformers' Llama: RMSNorm in fp32
then cast back before the weight multiply, RoPE with the rotate_half convention and cos/sin in
the activation dtype (tables: rope.py, with transformers' RoPE scaling), SDPA with grouped kv
heads (causal, or under a mask for sliding windows and document boundaries: attention_mask),
SwiGLU MLP, optional q/k/v (Qwen2) and MLP biases, optional per-head q/k RMSNorms before RoPE
(Qwen3). A mixture-of-experts block (qwen3_moe, mixtral, qwen2_moe) shares the attention half
and runs moe_block.moe_mlp for the MLP (handing its router's statistics to a RouterStats when
the step trains with the load-balancing loss: router_aux.py).
"""
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from horizon_exec.model.moe_block import moe_mlp
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec


def rms_norm(x, w, eps: float):
    """x (..., H), w (H,): HF LlamaRMSNorm (statistics in fp32, output in x's dtype)."""
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dt)


def attention_mask(seq: int, window: int, docs, device):
    """Which keys each query may attend to, or None for plain causal attention (the kernel's
    own is_causal, which skips masked tiles). A query at t sees keys s <= t with t - s < window
    (window 0: no limit; transformers' sliding_window_causal_mask) and, when `docs` (rows, T)
    int gives each token's document, only keys of its own document.
    Returns bool (T, T), or (rows, 1, T, T) with documents; True = attend."""
    limited = 0 < window < seq
    if docs is None and not limited:
        return None
    if docs is None:
        allowed = torch.ones(seq, seq, dtype=torch.bool, device=device)          # (T, T)
    else:
        allowed = docs[:, :, None] == docs[:, None, :]                           # (rows, T, T)
    allowed.tril_()                                              # key <= query
    if limited:
        allowed.triu_(1 - window)                                # query - key < window
    return allowed if docs is None else allowed[:, None]


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def check_runnable(m: ModelSpec) -> None:
    """One-line errors for blocks the template does not run (train_cmd checks before allocating)."""
    if m.ffn_type != "gated" or m.norm != "rmsnorm":
        raise HorizonError(f"model {m.name!r}: the executor's block template is a gated (SwiGLU) "
                           f"MLP with RMSNorm; {m.ffn_type} MLP with {m.norm} is not supported")


class DecoderBlock:
    """y = block(w, x, cos, sin, window, docs) for x (B, T, H); w maps transformers names
    relative to `model.layers.N.` to tensors (see layout.block_layout); cos, sin (T, hd) or
    (B, 1, T, hd) (positions per sequence); window: this block's sliding window (0 = none);
    docs (B, T) int: each token's document, or None (see attention_mask). The mask is made
    here, so autograd holds its only reference and frees it with the attention's backward.
    router: a RouterStats (router_aux.py) an MoE block's router fills, or None."""

    def __init__(self, m: ModelSpec):
        check_runnable(m)
        self.m = m
        self.scale = m.hd ** -0.5

    def __call__(self, w: Mapping, x, cos, sin, window: int = 0, docs=None, router=None):
        m = self.m
        B, T, H = x.shape
        nh, nkv, hd = m.n_heads, m.n_kv_heads, m.hd
        # ---- attention ----------------------------------------------------------------
        h = rms_norm(x, w["input_layernorm.weight"], m.norm_eps)            # (B, T, H)
        q = F.linear(h, w["self_attn.q_proj.weight"], w.get("self_attn.q_proj.bias"))
        k = F.linear(h, w["self_attn.k_proj.weight"], w.get("self_attn.k_proj.bias"))
        v = F.linear(h, w["self_attn.v_proj.weight"], w.get("self_attn.v_proj.bias"))
        q, k = q.view(B, T, nh, hd), k.view(B, T, nkv, hd)
        if m.qk_norm:  # Qwen3: each head's q and k normalised over head_dim, before RoPE
            q = rms_norm(q, w["self_attn.q_norm.weight"], m.norm_eps)
            k = rms_norm(k, w["self_attn.k_norm.weight"], m.norm_eps)
        q = q.transpose(1, 2)                                               # (B, nh, T, hd)
        k = k.transpose(1, 2)                                               # (B, nkv, T, hd)
        v = v.view(B, T, nkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        mask = attention_mask(T, window, docs, x.device)                    # None: causal
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           scale=self.scale, enable_gqa=nkv != nh)  # (B, nh, T, hd)
        del mask
        o = o.transpose(1, 2).reshape(B, T, nh * hd)
        x = x + F.linear(o, w["self_attn.o_proj.weight"])
        # ---- MLP ------------------------------------------------------------------------
        h = rms_norm(x, w["post_attention_layernorm.weight"], m.norm_eps)
        if m.n_experts:
            return x + moe_mlp(m, w, h, router)
        g = F.linear(h, w["mlp.gate_proj.weight"], w.get("mlp.gate_proj.bias"))  # (B, T, F)
        u = F.linear(h, w["mlp.up_proj.weight"], w.get("mlp.up_proj.bias"))
        return x + F.linear(F.silu(g) * u, w["mlp.down_proj.weight"], w.get("mlp.down_proj.bias"))
