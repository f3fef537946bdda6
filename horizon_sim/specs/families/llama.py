"""Llama (LlamaForCausalLM): RMSNorm before attention and before the MLP, q/k/v/o projections
without biases, RoPE, a SwiGLU MLP (biases when the config's mlp_bias), untied or tied head.
The block Qwen2 and Mistral share (their modules reuse these three functions).

HF config: mlp_bias -> mlp_bias; attention_bias true (a bias on o too) is refused."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import (attention_kernels, attention_projections, block_tensors,
                                           dense_mlp_kernels, gated_mlp_projections)
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import HfFamily, defaults_with, refuse_attention_bias
from horizon_sim.specs.hf_values import as_bool


def projections(m):
    return (*attention_projections(m, m.qkv_bias), *gated_mlp_projections(m, m.mlp_bias))


def kernels(m):
    return (*attention_kernels(m, qk_norm=False), *dense_mlp_kernels(m, gated=True))


def tensors(m):
    return block_tensors(m, projections(m))


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    refuse_attention_bias(cfg, "llama", where)
    return dict(mlp_bias=as_bool(cfg, "mlp_bias", where, False))


def _export(spec) -> dict:
    if spec.qkv_bias:
        raise HorizonError(f"model {spec.name!r}: llama has no q/k/v biases alone (its attention_bias also "
                           "biases o); family qwen2 has them")
    if spec.layer_windows:
        raise HorizonError(f"model {spec.name!r}: llama has no sliding windows; family mistral (one window "
                           "on every layer) or qwen2 (per layer) has them")
    return {"attention_bias": False, "mlp_bias": spec.mlp_bias}


HF = HfFamily(
    "llama", "LlamaForCausalLM",
    defaults_with(intermediate_size=11008, num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
                  attention_bias=False, mlp_bias=False),
    frozenset({"attention_bias", "mlp_bias"}), _read, _export)

FAMILY = ModelFamily("llama", "RMSNorm, RoPE, SwiGLU MLP (Llama 2/3)", projections, kernels, tensors, hf=HF)
