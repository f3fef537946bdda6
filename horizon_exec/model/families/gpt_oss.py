"""gpt-oss's block: Llama's layout with every RMSNorm multiplying its weight in fp32
(GptOssRMSNorm), attention with biases and a sink logit per head (layers.self_attention with
sinks: the chunked kernel, softcap_attention.py), the sliding window on the layers that have one,
and gpt-oss's MoE MLP (gpt_oss_experts.py)."""
from horizon_exec.model.gpt_oss_experts import gpt_oss_mlp
from horizon_exec.model.layers import rms_norm, self_attention


def norm(x, w, eps):
    return rms_norm(x, w, eps, fp32_weight=True)


def forward(m, w, x, cos, sin, window=0, docs=None, router=None):
    h = norm(x, w["input_layernorm.weight"], m.norm_eps)
    x = x + self_attention(m, w, h, cos, sin, window, docs, sinks=w["self_attn.sinks"])
    h = norm(x, w["post_attention_layernorm.weight"], m.norm_eps)
    return x + gpt_oss_mlp(m, w, h, router)
