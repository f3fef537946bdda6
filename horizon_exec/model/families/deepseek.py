"""DeepSeek-V2/V3's block: Llama's layout (RMSNorm before each half, residual adds) with
multi-head latent attention (model/mla.py) and, per block, a dense SwiGLU (the first
first_dense_layers blocks) or the MoE MLP with shared experts (model/deepseek_moe.py). The engine
calls it with the block's own spec (ModelSpec.block_spec), which says which."""
from horizon_exec.model.deepseek_moe import deepseek_moe
from horizon_exec.model.layers import rms_norm, swiglu_mlp
from horizon_exec.model.mla import mla_attention


def forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    h = rms_norm(x, w["input_layernorm.weight"], m.norm_eps)
    x = x + mla_attention(m, w, h, cos, sin, window, docs)
    h = rms_norm(x, w["post_attention_layernorm.weight"], m.norm_eps)
    return x + (deepseek_moe(m, w, h) if m.n_experts else swiglu_mlp(w, h))
