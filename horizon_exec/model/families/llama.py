"""Llama's block (Qwen2 and Mistral run it too: their differences are biases and windows, which
the weights and the window argument carry): x + attention(RMSNorm(x)), then + SwiGLU(RMSNorm)."""
from horizon_exec.model.layers import rms_norm, self_attention, swiglu_mlp


def forward(m, w, x, cos, sin, window=0, docs=None, router=None, qk_norm: bool = False):
    h = rms_norm(x, w["input_layernorm.weight"], m.norm_eps)                # (B, T, H)
    x = x + self_attention(m, w, h, cos, sin, window, docs, qk_norm)
    h = rms_norm(x, w["post_attention_layernorm.weight"], m.norm_eps)       # the first norm's output freed
    return x + swiglu_mlp(w, h)
