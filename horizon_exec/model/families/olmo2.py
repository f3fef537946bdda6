"""OLMo-2's block: no norm before either half; q and k each normalised over the whole projection
(RMSNorm q_dim and kv_dim wide) before RoPE, and each half's output normalised before its residual
add: x + post_attention_layernorm(attention(x)), then + post_feedforward_layernorm(SwiGLU(x)).
Olmo2RMSNorm multiplies its weight in fp32 and then casts (rms_norm's fp32_weight)."""
from horizon_exec.model.layers import qkv_projections, rms_norm, self_attention, swiglu_mlp


def normed_qk(m, w, h):
    """q, k and v, then q and k through their whole-width norms (the order Qwen3's per-head
    norms run in, which the planner's temporaries follow)."""
    q, k, v = qkv_projections(m, w, h)
    return norm(q, w["self_attn.q_norm.weight"], m.norm_eps), norm(k, w["self_attn.k_norm.weight"], m.norm_eps), v


def norm(x, w, eps):
    return rms_norm(x, w, eps, fp32_weight=True)


def forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    x = x + norm(self_attention(m, w, x, cos, sin, window, docs, project=normed_qk),
                 w["post_attention_layernorm.weight"], m.norm_eps)
    return x + norm(swiglu_mlp(w, x), w["post_feedforward_layernorm.weight"], m.norm_eps)
