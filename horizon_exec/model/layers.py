"""The pieces decoder blocks are made of, as plain functions of named weights (each family's
forward, horizon_exec/model/families/<name>.py, composes them; block.py's DecoderBlock runs it).

A block knows nothing about slots, streams or the host store: the engine binds the weights
(views into a device slot) and calls it. Numerics follow transformers: RMSNorm in fp32 then cast
back before the weight multiply, RoPE with the rotate_half convention and cos/sin in the
activation dtype (tables: rope.py, with transformers' RoPE scaling), SDPA with grouped kv heads
(causal, or under a mask for sliding windows and document boundaries: attention_mask; with
soft-capped scores: flex_softcap.py on a GPU, softcap_attention.py elsewhere), SwiGLU or
GELU-tanh gated MLP, optional q/k/v and MLP biases, optional per-head q/k RMSNorms before RoPE; Gemma's (1 + w) RMSNorm; LayerNorm with a
bias and RoPE on part of each head (GPT-NeoX).
"""
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from horizon_exec.model.adapters import linear
from horizon_exec.model import flex_softcap
from horizon_exec.model.softcap_attention import softcap_attention
from horizon_sim.specs.families import family
from horizon_sim.specs.model import ModelSpec


def rms_norm(x, w, eps: float, fp32_weight: bool = False):
    """x (..., H), w (H,): HF LlamaRMSNorm (statistics in fp32, cast back to x's dtype, then times
    w); with fp32_weight, Olmo2RMSNorm's order (times w in fp32, then cast back)."""
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (w * h).to(dt) if fp32_weight else w * h.to(dt)


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


def layer_norm(x, w, b, eps: float):
    """x (..., H), w and b (H,): nn.LayerNorm (in x's dtype; the kernel's statistics are fp32)."""
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def named_layer_norm(w: Mapping, name: str, x, eps: float):
    """layer_norm of x by the block's LayerNorm `name` (its `name.weight` and `name.bias` in w)."""
    return layer_norm(x, w[f"{name}.weight"], w[f"{name}.bias"], eps)


def rotate_half(x, rotary_dim: int = 0):
    """transformers' rotate_half of x's first rotary_dim dimensions (0: all of them), the rest
    passed through after them: RoPE's tables are 0 in sin there (rope.py), so they add nothing."""
    d = rotary_dim or x.shape[-1]
    half = d // 2
    if d == x.shape[-1]:
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return torch.cat((-x[..., half:d], x[..., :half], x[..., d:]), dim=-1)


def qkv_projections(m: ModelSpec, w: Mapping, h):
    """q, k, v (B, T, width) of the normed h by three projections, with biases when w has them."""
    return linear(h, w, "self_attn.q_proj"), linear(h, w, "self_attn.k_proj"), linear(h, w, "self_attn.v_proj")


def self_attention(m: ModelSpec, w: Mapping, h, cos, sin, window: int, docs, qk_norm: bool = False,
                   project=qkv_projections, norm=rms_norm, out="self_attn.o_proj", sinks=None):
    """The attention half after its norm: h (B, T, H) normed -> o_proj's output (B, T, H),
    before the residual. q, k, v by `project` (m, w, h) (three projections, or a family's fused
    one), per-head q/k RMSNorms before RoPE when qk_norm (Qwen3), RoPE, SDPA with grouped kv
    heads (causal, or under attention_mask for sliding windows and document boundaries), the
    output projection (`out`: a Linear's name, with its bias when w has one, or a function of
    the heads' output, GPT-2's Conv1D). cos None: no RoPE (learned positions, GPT-2). sinks (nh,):
    a sink logit per head (gpt-oss), which only the chunked kernel runs (on a GPU too: flex
    attention would need its logsumexp's gradient).
    Each step rebinds q and k, so the tensor it replaced is freed at once (the measured
    temporaries the planner prices, schedule/work.py, depend on it). The mask is made here, so
    autograd holds its only reference and frees it with the attention's backward."""
    B, T, _ = h.shape
    nh, nkv, hd = m.n_heads, m.n_kv_heads, m.hd
    q, k, v = project(m, w, h)
    q, k = q.view(B, T, nh, hd), k.view(B, T, nkv, hd)
    if qk_norm:  # each head's q and k normalised over head_dim (by `norm`: Gemma 3's is gemma_norm), before RoPE
        q = norm(q, w["self_attn.q_norm.weight"], m.norm_eps)
        k = norm(k, w["self_attn.k_norm.weight"], m.norm_eps)
    q = q.transpose(1, 2)                                               # (B, nh, T, hd)
    k = k.transpose(1, 2)                                               # (B, nkv, T, hd)
    v = v.view(B, T, nkv, hd).transpose(1, 2)
    if cos is not None:
        rd = m.rotary_dim if m.rotary_dim < hd else 0                   # 0: the whole head
        q = q * cos + rotate_half(q, rd) * sin
        k = k * cos + rotate_half(k, rd) * sin
    scale = (m.query_scale or hd) ** -0.5                               # Gemma's query_pre_attn_scalar
    if sinks is not None:  # a sink per head, which SDPA cannot add: chunks of rows
        o = softcap_attention(q, k, v, scale, m.attn_softcap, window, docs, sinks)
    elif m.attn_softcap:  # scores soft-capped, which SDPA cannot: one fused kernel on a GPU, else chunks of rows
        attend = flex_softcap.flex_softcap_attention if flex_softcap.usable(q) else softcap_attention
        o = attend(q, k, v, scale, m.attn_softcap, window, docs)
    else:
        mask = attention_mask(T, window, docs, h.device)                # None: causal
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           scale=scale, enable_gqa=nkv != nh)  # (B, nh, T, hd)
        del mask
    o = o.transpose(1, 2).reshape(B, T, nh * hd)
    return out(o) if callable(out) else linear(o, w, out)


def swiglu_mlp(w: Mapping, h, act=F.silu, prefix: str = "mlp."):
    """h (B, T, H) normed -> down(act(gate(h)) * up(h)) (B, T, H), biases when w has them; act
    SiLU, or Gemma's GELU-tanh (gelu_tanh); prefix: the module's (DeepSeek's shared experts are
    mlp.shared_experts.)."""
    g = linear(h, w, f"{prefix}gate_proj")  # (B, T, F)
    u = linear(h, w, f"{prefix}up_proj")
    return linear(act(g) * u, w, f"{prefix}down_proj")


def plain_gelu(m: ModelSpec, x):
    """A plain MLP's GELU as m's config names it: erf's for gelu, the tanh form for gelu_new,
    gelu_fast and gelu_pytorch_tanh; ModelSpec.hidden_act "" is the family's own (its config
    row's first: GPT-NeoX's gelu, GPT-2's gelu_new)."""
    act = m.hidden_act or family(m.family).hf.activations[0]
    return F.gelu(x, approximate="none" if act == "gelu" else "tanh")


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def gemma_norm(x, w, eps: float):
    """Gemma's RMSNorm: statistics and (1 + w) in fp32, then cast back to x's dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + w.float())).to(x.dtype)
