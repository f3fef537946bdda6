"""Multi-head latent attention (DeepSeek-V2/V3; horizon_sim/specs/mla.py has the shapes) as a plain
function of named weights: transformers 5's DeepseekV2Attention / DeepseekV3Attention, kernel for
kernel, so fp32 results match them to rounding.

q from q_proj, or q_b_proj(q_a_layernorm(q_a_proj(h))); the latent kv_a_proj_with_mqa(h) split
into c (normed by kv_a_layernorm) and the shared rotated key part; each head's unrotated key
and value from kv_b_proj(c); RoPE on q's last qk_rope_head_dim dimensions and on the shared key
part; q = [q_nope, q_rot], k = [k_nope, k_rot] (the shared part copied to every head, as
transformers' expand_kv copies it); SDPA with the MLA softmax scale (causal, or under a mask for
document boundaries), v padded with zeros to the q/k head width so the fused kernels run (their
one head width; the padding's outputs are dropped); o_proj.

RoPE on interleaved pairs (x0, x1), (x2, x3), ...: V3 rotates them in the activation dtype and
writes the pairs' first members, then their second (apply_rotary_pos_emb_interleave); V2 rotates
them as complex numbers in fp32 and keeps them interleaved (apply_rotary_emb). The two differ by
a permutation of the rotated dimensions that q and k share, so their products do not."""
import torch
import torch.nn.functional as F

from horizon_exec.model.adapters import linear
from horizon_exec.model.layers import attention_mask, rms_norm
from horizon_sim.specs import mla


def _rope_v3(x, cos, sin):
    """x (..., r) interleaved pairs -> [x0 c - x1 s, x1 c + x0 s] (the pairs taken apart)."""
    c, s = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _rotate_pairs(x, cos, sin, sign: float):
    """x's interleaved pairs times cos + sign i sin, in fp32, kept interleaved, in x's dtype."""
    c, s = cos[..., : cos.shape[-1] // 2].float(), sin[..., : sin.shape[-1] // 2].float() * sign
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).type_as(x)


class _RopeV2(torch.autograd.Function):
    """V2's rotation as one function: it keeps the tables alone (views of the Schedule's), where
    autograd would keep their fp32 copies; its gradient is the inverse rotation."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate_pairs(x, cos, sin, 1.0)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _rotate_pairs(dy, cos, sin, -1.0), None, None


def _rope_v2(x, cos, sin):
    """x (..., r) interleaved pairs times cos + i sin in fp32, kept interleaved, back in x's dtype."""
    return _RopeV2.apply(x, cos, sin)


def mla_attention(m, w, h, cos, sin, window: int = 0, docs=None):
    """h (B, T, H) normed -> o_proj's output (B, T, H), before the residual. cos, sin (T, r) or
    (B, 1, T, r): the rotated part's tables (ModelSpec.rope_width)."""
    B, T, _ = h.shape
    n, hd, r, dv, eps = m.n_heads, m.hd, m.qk_rope_head_dim, m.v_head_dim, m.norm_eps
    nope = hd - r
    rope = _rope_v3 if m.family == "deepseek_v3" else _rope_v2
    if m.q_lora_rank:
        q = linear(rms_norm(linear(h, w, "self_attn.q_a_proj"), w["self_attn.q_a_layernorm.weight"], eps),
                   w, "self_attn.q_b_proj")
    else:
        q = linear(h, w, "self_attn.q_proj")
    q = q.view(B, T, n, hd).transpose(1, 2)                              # (B, n, T, hd)
    q_pass, q_rot = torch.split(q, [nope, r], dim=-1)
    latent = linear(h, w, "self_attn.kv_a_proj_with_mqa")                # (B, T, c + r)
    c, k_rot = torch.split(latent, [m.kv_lora_rank, r], dim=-1)
    c = rms_norm(c, w["self_attn.kv_a_layernorm.weight"], eps).view(B, 1, T, m.kv_lora_rank)
    k_rot = k_rot.reshape(B, 1, T, r)
    q = torch.cat((q_pass, rope(q_rot, cos, sin)), dim=-1)               # (B, n, T, hd)
    k_rot = rope(k_rot, cos, sin)
    del q_pass, q_rot, latent
    kv = linear(c, w, "self_attn.kv_b_proj").view(B, T, n, nope + dv).transpose(1, 2)
    k_nope, v = torch.split(kv, [nope, dv], dim=-1)
    k = kv.new_empty(B, n, T, hd)                                        # transformers' expand_kv
    k[..., :nope].copy_(k_nope)
    k[..., nope:].copy_(k_rot.expand(-1, n, -1, -1))
    del kv, k_nope, k_rot, c
    mask = attention_mask(T, window, docs, h.device)                     # None: causal
    if dv < hd:  # v padded to the q/k head width with zeros: the fused kernels want one head width
        v = F.pad(v, (0, hd - dv))                                       # (transformers' flash path does the same)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=mla.softmax_scale(m))
    del mask, q, k, v
    return linear(o[..., :dv].transpose(1, 2).reshape(B, T, n * dv), w, "self_attn.o_proj")
