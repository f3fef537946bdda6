"""RoPE tables of a ModelSpec, equal to transformers' (modeling_rope_utils and
LlamaRotaryEmbedding, transformers 5): the same fp32 operations in the same order, so the
tables match bit for bit (tests/test_hf_features.py compares them).

    inv_freq (rotary_dim/2,) fp32 and the attention factor, by the spec's rope_scaling kind
    cos, sin (T, hd) = cos/sin of positions x inv_freq, duplicated to the rotated width, times
    the factor, cast to the activation dtype

A head rotated in part (ModelSpec.rotary_dim < hd: GPT-NeoX's rotary_pct) has its frequencies
from the rotated width, as transformers computes them, and its tables padded to hd with cos 1
and sin 0, so the pass-through dimensions come out of q * cos + rotate_half(q) * sin as they
went in (layers.rotate_half pairs the rotated ones) and the Schedule's (T, hd) tables keep
their shape.
"""
import math
from dataclasses import replace

import torch

from horizon_sim.specs.model import ModelSpec


def _base_inv_freq(theta, dim: int, device):
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float) / dim))


def _llama3(m: ModelSpec, device):
    s = m.rope_scaling
    inv = _base_inv_freq(m.rope_theta, m.rotary_dim, device)
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > low_wavelen, inv / s.factor, inv)       # low frequencies: interpolate
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * out / s.factor + smooth * out
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, out), 1.0


def _dynamic(m: ModelSpec, seq: int, device):
    """NTK-aware: the base grows once the sequence passes max_position. transformers builds
    the table for max_position at init (Python floats) and rebuilds it in forward with the
    sequence length as a tensor (fp32 arithmetic) when a batch is longer."""
    s, dim = m.rope_scaling, m.rotary_dim
    if seq <= m.max_position:
        n, base = m.max_position, m.rope_theta
        base = base * ((s.factor * n / m.max_position) - (s.factor - 1)) ** (dim / (dim - 2))
    else:
        n = torch.tensor(seq, dtype=torch.int64, device=device)
        base = m.rope_theta * ((s.factor * n / m.max_position) - (s.factor - 1)) ** (dim / (dim - 2))
    return _base_inv_freq(base, dim, device), 1.0


def _yarn(m: ModelSpec, device):
    s, dim, base = m.rope_scaling, m.rotary_dim, m.rope_theta
    factor = s.factor

    def mscale(scale, ms=1.0):
        return 1.0 if scale <= 1 else 0.1 * ms * math.log(scale) + 1.0

    attn = s.attention_factor or (mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim)
                                  if s.mscale and s.mscale_all_dim else mscale(factor))

    def corr_dim(rot):
        return (dim * math.log(s.original_max_position / (rot * 2 * math.pi))) / (2 * math.log(base))

    # 0 means the default, as transformers' `beta_fast or 32` (a 0 would divide by zero)
    low, high = corr_dim(s.beta_fast or 32.0), corr_dim(s.beta_slow or 1.0)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1).to(device)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp                                  # share of extrapolation per frequency
    return inter * (1 - keep) + extra * keep, float(attn)


def _longrope(m: ModelSpec, seq: int, device):
    """Each frequency divided by its own factor: the long ones when the sequence passes the
    pretraining context (transformers switches by the longest position a batch holds; a step of
    `seq` tokens holds seq - 1, and document masks past that context are refused:
    runtime/positions.py), else the short ones; cos/sin times an attention factor."""
    s, dim = m.rope_scaling, m.rotary_dim
    factor = s.factor or m.max_position / s.original_max_position
    attn = s.attention_factor or (1.0 if factor <= 1.0 else
                                  math.sqrt(1 + math.log(factor) / math.log(s.original_max_position)))
    ext = torch.tensor(s.long_factor if seq > s.original_max_position else s.short_factor,
                       dtype=torch.float32, device=device)
    shape = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return 1.0 / (ext * m.rope_theta ** shape), attn


def inv_freq(m: ModelSpec, seq: int, device=None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (rotary_dim/2,) fp32, attention factor) for sequences of `seq` tokens."""
    s = m.rope_scaling
    if s is None:
        return _base_inv_freq(m.rope_theta, m.rotary_dim, device), 1.0
    if s.kind == "linear":
        inv = _base_inv_freq(m.rope_theta, m.rotary_dim, device)
        inv /= s.factor
        return inv, 1.0
    if s.kind == "llama3":
        return _llama3(m, device)
    if s.kind == "dynamic":
        return _dynamic(m, seq, device)
    if s.kind == "longrope":
        return _longrope(m, seq, device)
    return _yarn(m, device)


def rope_tables(m: ModelSpec, seq: int, dtype, device):
    """cos, sin (T, m.rope_width: hd, or MLA's rotated part) for positions 0..T-1 in the
    activation dtype."""
    inv, attn = inv_freq(m, seq, device)
    pos = torch.arange(seq, device=device, dtype=torch.float32)
    freqs = pos[:, None] * inv.to(device=device, dtype=torch.float)[None, :]   # (T, rotary_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)                                  # (T, rotary_dim)
    cos, sin = (emb.cos() * attn).to(dtype), (emb.sin() * attn).to(dtype)
    if m.rotary_dim < m.rope_width:  # the pass-through dimensions: times 1, plus 0
        pad = (0, m.rope_width - m.rotary_dim)
        cos, sin = torch.nn.functional.pad(cos, pad, value=1.0), torch.nn.functional.pad(sin, pad, value=0.0)
    return cos, sin


def rope_tables_per_base(m: ModelSpec, seq: int, dtype, device) -> list:
    """[(cos, sin)] per RoPE table of m (ModelSpec.rope_table_count): the model's, then with a
    base of the sliding layers' own (Gemma 3), that base's, unscaled."""
    tabs = [rope_tables(m, seq, dtype, device)]
    if m.rope_table_count > 1:
        tabs.append(rope_tables(replace(m, rope_theta=m.rope_local_theta, rope_scaling=None, rope_local_theta=0.0),
                                seq, dtype, device))
    return tabs
