"""Qwen2-MoE (Qwen2MoeForCausalLM): Qwen2's attention (q/k/v biases unless the config's qkv_bias
is false), then an MoE MLP (specs/moe.py): the router, the experts, and a dense SwiGLU shared
expert (mlp.shared_expert.{gate,up,down}_proj) scaled per token by sigmoid(x . w), w =
mlp.shared_expert_gate.weight (1 x H), added to the experts' output.

HF config: the routing fields (hf_moe.py), moe_intermediate_size, norm_topk_prob,
shared_expert_intermediate_size -> shared_expert_ffn_hidden, qkv_bias (default true)."""
from horizon_sim.specs import hf_moe
from horizon_sim.specs.block_parts import attention_kernels, attention_projections, block_tensors, moe_kernels, moe_projections
from horizon_sim.specs.families.family import ModelFamily, MoeTraits
from horizon_sim.specs.hf_families import (MOE_DEFAULTS, QWEN_MOE_FIELDS, QWEN_WINDOWS, WINDOW_FIELDS, HfFamily,
                                           defaults_with, export_qwen_experts, read_qwen_experts)
from horizon_sim.specs.hf_values import as_bool, as_int


def projections(m):
    return (*attention_projections(m, m.qkv_bias), *moe_projections(m, router_first=True))


def kernels(m):
    return (*attention_kernels(m, qk_norm=False), *moe_kernels(m))


def tensors(m):
    return block_tensors(m, projections(m))


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    routing = hf_moe.read(cfg, "qwen2_moe", where, experts_key="num_experts", aliased=False)
    return dict(**routing, **read_qwen_experts(cfg, where),
                shared_expert_ffn_hidden=as_int(cfg, "shared_expert_intermediate_size", where),
                qkv_bias=as_bool(cfg, "qkv_bias", where, True))


HF = HfFamily(
    "qwen2_moe", "Qwen2MoeForCausalLM",
    defaults_with(vocab_size=151936, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=5632, num_key_value_heads=16, max_position_embeddings=32768, **QWEN_WINDOWS,
                  decoder_sparse_step=1, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                  num_experts_per_tok=4, num_experts=60, norm_topk_prob=False, mlp_only_layers=None,
                  qkv_bias=True, **MOE_DEFAULTS),
    QWEN_MOE_FIELDS | WINDOW_FIELDS | {"shared_expert_intermediate_size", "qkv_bias"},
    _read,
    lambda s: {**export_qwen_experts(s), "shared_expert_intermediate_size": s.shared_expert_ffn_hidden,
               "qkv_bias": s.qkv_bias})

FAMILY = ModelFamily("qwen2_moe", "Qwen2's attention, routed SwiGLU experts and a gated shared expert (Qwen2-MoE)",
                     projections, kernels, tensors, hf=HF, qkv_bias=True,
                     moe=MoeTraits(router_first=True, shared_expert=True))
