"""Gemma 2's block: a norm before and after each half (the sandwich), Gemma's (1 + w) RMSNorm in
fp32, attention scaled by query_pre_attn_scalar ** -0.5 with its scores soft-capped
(layers.self_attention reads both from the spec), a GELU-tanh gated MLP:
x + post_attention_layernorm(attention(input_layernorm(x))), then the same around the MLP with
pre_ and post_feedforward_layernorm. The embedding's scale and the logits' soft-cap are the
embedding's and the head's (its ExecFamily in model/families, head.py). Gemma 3's language model runs it
with per-head q/k norms (gemma3_forward)."""
from horizon_exec.model.layers import gelu_tanh, gemma_norm, self_attention, swiglu_mlp


def forward(m, w, x, cos, sin, window=0, docs=None, router=None, qk_norm: bool = False):
    eps = m.norm_eps
    h = gemma_norm(x, w["input_layernorm.weight"], eps)
    x = x + gemma_norm(self_attention(m, w, h, cos, sin, window, docs, qk_norm, norm=gemma_norm),
                       w["post_attention_layernorm.weight"], eps)
    h = gemma_norm(x, w["pre_feedforward_layernorm.weight"], eps)
    return x + gemma_norm(swiglu_mlp(w, h, gelu_tanh), w["post_feedforward_layernorm.weight"], eps)


def gemma3_forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    """Gemma 3's language model: Gemma 2's block with per-head q/k norms (Gemma's), its RoPE per
    layer type in cos and sin (positions.py picks the table)."""
    return forward(m, w, x, cos, sin, window, docs, router, qk_norm=True)
