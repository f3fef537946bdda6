"""GPT-2's block: LayerNorm with biases before attention and before the MLP, the sequential
residual, q|k|v in one biased projection (attn.c_attn, its output [q | k | v] each hidden wide),
no RoPE (the embedding adds learned positions: runtime/ops.py), a biased output projection, a
plain GELU MLP (the tanh form: gelu_new, unless the config names erf's gelu). Weights are
stored (in, out) as transformers' Conv1D holds them, so each projection is x . W + b."""
import torch

from horizon_exec.model.adapters import adapt
from horizon_exec.model.layers import named_layer_norm as norm, plain_gelu, self_attention


def conv1d(w, name: str, x):
    """transformers' Conv1D: x . W + b, W (in, out) (and its adapter, as peft adapts a Conv1D)."""
    y = torch.addmm(w[f"{name}.bias"], x.reshape(-1, x.shape[-1]), w[f"{name}.weight"]).view(*x.shape[:-1], -1)
    return adapt(w, name, x, y)


def fused_qkv(m, w, h):
    return conv1d(w, "attn.c_attn", h).split(m.hidden, dim=-1)


def forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    h = norm(w, "ln_1", x, m.norm_eps)                                     # (B, T, H)
    x = x + self_attention(m, w, h, None, None, window, docs, project=fused_qkv,
                           out=lambda o: conv1d(w, "attn.c_proj", o))
    del h
    h = norm(w, "ln_2", x, m.norm_eps)
    u = plain_gelu(m, conv1d(w, "mlp.c_fc", h))
    del h
    return x + conv1d(w, "mlp.c_proj", u)
