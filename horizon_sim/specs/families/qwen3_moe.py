"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (per-head q/k norms), then an MoE MLP
(specs/moe.py): the experts (mlp.experts.{gate_up_proj, down_proj}) before the router (mlp.gate)
in transformers' order, no shared expert.

HF config: the routing fields (hf_moe.py), moe_intermediate_size -> expert_ffn_hidden,
norm_topk_prob; attention_bias true refused."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs import hf_moe
from horizon_sim.specs.block_parts import attention_kernels, attention_projections, block_tensors, moe_kernels, moe_projections
from horizon_sim.specs.families.family import ModelFamily, MoeTraits
from horizon_sim.specs.hf_families import (MOE_DEFAULTS, QWEN_MOE_FIELDS, HfFamily, defaults_with,
                                           export_qwen_experts, read_qwen_experts, refuse_attention_bias)


def projections(m):
    return (*attention_projections(m, False), *moe_projections(m, router_first=False))


def kernels(m):
    return (*attention_kernels(m, qk_norm=True), *moe_kernels(m))


def tensors(m):
    return block_tensors(m, projections(m), qk_norm=True)


def _check(m) -> None:
    if m.qkv_bias:
        raise HorizonError("model qwen3_moe: qkv_bias=True; only qwen2_moe has q/k/v biases alone")


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    refuse_attention_bias(cfg, "qwen3_moe", where)
    routing = hf_moe.read(cfg, "qwen3_moe", where, experts_key="num_experts", aliased=True)
    return dict(**routing, **read_qwen_experts(cfg, where))


def _preset(name, L, H, heads, F, I):
    # Qwen/Qwen3-30B-A3B and -235B-A22B config.json: 128 experts, 8 per token, norm_topk_prob
    # true, head_dim 128, 4 kv heads, rope_theta 1e6, 40960 positions, rms_norm_eps 1e-6,
    # decoder_sparse_step 1, mlp_only_layers [], output_router_logits false (so the aux loss,
    # router_aux_loss_coef 0.001, is not added to the loss), untied. total_params counts every
    # expert, active_params the k a token meets (MFU counts those).
    return dict(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=4, head_dim=128, ffn_hidden=F,
                vocab=151936, norm_eps=1e-6, rope_theta=1e6, max_position=40960, n_experts=128,
                experts_per_token=8, expert_ffn_hidden=I, norm_topk_prob=True)


PRESETS = (_preset("qwen3-30b-a3b", 48, 2048, 32, 6144, 768), _preset("qwen3-235b-a22b", 94, 4096, 64, 12288, 1536))

HF = HfFamily(
    "qwen3_moe", "Qwen3MoeForCausalLM",
    defaults_with(vocab_size=151936, hidden_size=2048, num_hidden_layers=24, intermediate_size=6144,
                  num_key_value_heads=4, max_position_embeddings=32768, attention_bias=False, use_sliding_window=False,
                  sliding_window=4096, decoder_sparse_step=1, moe_intermediate_size=768, num_experts_per_tok=8,
                  num_experts=128, norm_topk_prob=False, mlp_only_layers=None, **MOE_DEFAULTS),
    QWEN_MOE_FIELDS | {"num_local_experts", "attention_bias", "use_sliding_window", "sliding_window",
                       "max_window_layers"},
    _read, lambda s: {**export_qwen_experts(s), "attention_bias": False})

FAMILY = ModelFamily("qwen3_moe", "Qwen3's attention, routed SwiGLU experts (Qwen3-MoE)", projections, kernels,
                     tensors, hf=HF, moe=MoeTraits(router_first=False), check=_check, presets=PRESETS)
