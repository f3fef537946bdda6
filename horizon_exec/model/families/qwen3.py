"""Qwen3's block: Llama's with per-head q/k RMSNorms before RoPE."""
from horizon_exec.model.families import llama


def forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    return llama.forward(m, w, x, cos, sin, window, docs, router, qk_norm=True)
