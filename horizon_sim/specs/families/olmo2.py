"""OLMo-2 (Olmo2ForCausalLM, model_type olmo2): no norm before attention or the MLP; instead an
RMSNorm over the whole q projection and over the whole k projection (self_attn.q_norm, q_dim wide,
and k_norm, kv_dim wide, before RoPE), and an RMSNorm on each half's output before its residual add
(post_attention_layernorm, post_feedforward_layernorm); q/k/v/o without biases, a SwiGLU MLP,
untied head. Every norm (the final one too) multiplies its weight in fp32 before casting back
(Kernel.fp32_weight), and the MLP reads x1 itself, which its projections save.

HF config: the shared fields; attention_bias true is refused by name."""
from horizon_sim.specs.block_parts import (Kernel, attention_projections, block_tensors, gated_mlp_projections)
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import HfFamily, defaults_with, refuse_attention_bias


def projections(m):
    return (*attention_projections(m, False), *gated_mlp_projections(m, False))


def kernels(m):
    """q's and k's norms, RoPE, attention, the post-norm and the add (its output x1 is what gate and
    up read: saved), the SwiGLU, its post-norm, the add. Every norm multiplies its weight in fp32."""
    H, F = m.hidden, m.ffn_hidden
    return (Kernel("rmsnorm", "attention", m.q_dim, fp32_weight=True),
            Kernel("rmsnorm", "attention", m.kv_dim, fp32_weight=True),
            Kernel("rope", "attention", m.q_dim), Kernel("rope", "attention", m.kv_dim),
            Kernel("attention", "attention", m.q_dim, rows=m.n_heads, kv_width=m.kv_dim),
            Kernel("rmsnorm", "attention", H, fp32_weight=True), Kernel("residual", "attention", H, output_saved=True),
            Kernel("swiglu", "mlp", F), Kernel("rmsnorm", "mlp", H, fp32_weight=True), Kernel("residual", "mlp", H))


def tensors(m):
    """The attention's projections, its whole-projection q/k norms, the MLP's, the two post-norms."""
    ps = projections(m)
    return (*block_tensors(m, ps[:4], norm_tensors=()),
            ("self_attn.q_norm.weight", (m.q_dim,)), ("self_attn.k_norm.weight", (m.kv_dim,)),
            *block_tensors(m, ps[4:], norm_tensors=()),
            ("post_attention_layernorm.weight", (m.hidden,)), ("post_feedforward_layernorm.weight", (m.hidden,)))


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    refuse_attention_bias(cfg, "olmo2", where)
    return {}


HF = HfFamily(
    "olmo2", "Olmo2ForCausalLM",
    defaults_with(vocab_size=50304, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, max_position_embeddings=2048, pad_token_id=1,
                  attention_bias=False, rms_norm_eps=1e-5),
    frozenset({"attention_bias"}), _read, lambda spec: {"attention_bias": False})


def _olmo2(name: str, L: int, H: int, heads: int, kv: int, F: int) -> dict:
    # allenai/OLMo-2 config.json: vocabulary 100352 (pad token 100277), 4096 positions, RoPE base
    # 500000, RMSNorm eps 1e-6, untied head
    return dict(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv, ffn_hidden=F, vocab=100352,
                max_position=4096, rope_theta=500000.0, norm_eps=1e-6, padding_idx=100277)


PRESETS = (
    # allenai/OLMo-2-1124-7B and -13B, allenai/OLMo-2-0325-32B (the OLMo 2 report, arXiv 2501.00656);
    # their safetensors hold 7,298,617,344, 13,716,198,400 and 32,234,279,936 parameters
    _olmo2("olmo-2-7b", 32, 4096, 32, 32, 11008),
    _olmo2("olmo-2-13b", 40, 5120, 40, 40, 13824),
    _olmo2("olmo-2-32b", 64, 5120, 40, 8, 27648),
)

FAMILY = ModelFamily("olmo2", "q/k RMSNorms over the whole projections, norms after each half (OLMo-2)",
                     projections, kernels, tensors, hf=HF, presets=PRESETS)
