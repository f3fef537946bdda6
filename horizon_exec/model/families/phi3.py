"""Phi-3 / Phi-4's block: Llama's, with q, k and v in one projection (self_attn.qkv_proj, rows
q then k then v) and gate and up in one (mlp.gate_up_proj, gate's rows first), as transformers
and the checkpoints hold them. v is copied out of the fused output, so the graph keeps v and
not the whole q|k|v output (transformers keeps the view; no result changes)."""
import torch.nn.functional as F

from horizon_exec.model.adapters import linear
from horizon_exec.model.layers import rms_norm, self_attention


def fused_qkv(m, w, h):
    q, k, v = linear(h, w, "self_attn.qkv_proj").split((m.q_dim, m.kv_dim, m.kv_dim), dim=-1)
    return q, k, v.contiguous()


def forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    h = rms_norm(x, w["input_layernorm.weight"], m.norm_eps)                # (B, T, H)
    x = x + self_attention(m, w, h, cos, sin, window, docs, project=fused_qkv)
    h = rms_norm(x, w["post_attention_layernorm.weight"], m.norm_eps)
    gate, up = linear(h, w, "mlp.gate_up_proj").chunk(2, dim=-1)  # (B, T, F) each
    return x + linear(up * F.silu(gate), w, "mlp.down_proj")
