"""Qwen3 (Qwen3ForCausalLM): Llama's block with an RMSNorm over each head of q and of k before
RoPE (self_attn.q_norm, k_norm: head_dim weights each), sliding windows per layer as Qwen2.

HF config: head_dim defaults to 128; windows as qwen2; attention_bias true refused."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import attention_kernels, block_tensors, dense_mlp_kernels
from horizon_sim.specs.families import llama
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import (QWEN_WINDOWS, WINDOW_FIELDS, HfFamily, defaults_with,
                                           export_windows_by_layer, refuse_attention_bias, windows_by_layer)


def kernels(m):
    return (*attention_kernels(m, qk_norm=True), *dense_mlp_kernels(m, gated=True))


def tensors(m):
    return block_tensors(m, llama.projections(m), qk_norm=True)


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    refuse_attention_bias(cfg, "qwen3", where)
    return dict(layer_windows=windows_by_layer(cfg, where, n_layers))


def _export(spec) -> dict:
    if spec.qkv_bias or spec.mlp_bias:
        raise HorizonError(f"model {spec.name!r}: q/k norms with biases have no transformers class "
                           "(qwen3's attention_bias also adds an o bias)")
    # Qwen3Config's head_dim default is 128, not hidden // heads: always written
    return {"head_dim": spec.hd, "attention_bias": False, **export_windows_by_layer(spec)}


PRESETS = (
    # Qwen/Qwen3-8B config.json: q/k norms, head_dim 128 (= 4096 / 32), rope_theta 1e6, 40960 positions.
    dict(name="qwen3-8b", n_layers=36, hidden=4096, n_heads=32, n_kv_heads=8, ffn_hidden=12288, vocab=151936,
         norm_eps=1e-6, rope_theta=1e6, max_position=40960),
)

HF = HfFamily(
    "qwen3", "Qwen3ForCausalLM",
    defaults_with(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, head_dim=128,
                  max_position_embeddings=32768, attention_bias=False, **QWEN_WINDOWS),
    WINDOW_FIELDS | {"attention_bias"}, _read, _export)

FAMILY = ModelFamily("qwen3", "Llama's block with per-head q/k RMSNorms before RoPE (Qwen3)",
                     llama.projections, kernels, tensors, hf=HF, presets=PRESETS)
