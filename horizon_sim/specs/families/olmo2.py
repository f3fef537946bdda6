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

FAMILY = ModelFamily("olmo2", "q/k RMSNorms over the whole projections, norms after each half (OLMo-2)",
                     projections, kernels, tensors, hf=HF)
