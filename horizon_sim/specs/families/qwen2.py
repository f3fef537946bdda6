"""Qwen2 / Qwen2.5 (Qwen2ForCausalLM): Llama's block with biases on q, k and v (never on o or
the MLP), and sliding windows per layer.

HF config: qkv_bias = True; use_sliding_window, sliding_window, max_window_layers, layer_types
-> layer_windows; use_mrope (multimodal RoPE) refused."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import llama
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import (QWEN_WINDOWS, WINDOW_FIELDS, HfFamily, defaults_with,
                                           export_windows_by_layer, windows_by_layer)


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    if cfg.get("use_mrope"):
        raise HorizonError(f"{where}: use_mrope = true (multimodal RoPE) is not supported")
    return dict(qkv_bias=True, layer_windows=windows_by_layer(cfg, where, n_layers))


def _export(spec) -> dict:
    if spec.mlp_bias or not spec.qkv_bias:
        raise HorizonError(f"model {spec.name!r}: qwen2 has q/k/v biases and no MLP biases (qkv_bias="
                           f"{spec.qkv_bias}, mlp_bias={spec.mlp_bias} have no transformers class)")
    return export_windows_by_layer(spec)  # Qwen2 windows any subset of layers (layer_types)


HF = HfFamily(
    "qwen2", "Qwen2ForCausalLM",
    defaults_with(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, max_position_embeddings=32768,
                  **QWEN_WINDOWS),
    WINDOW_FIELDS | {"use_mrope"}, _read, _export)

FAMILY = ModelFamily("qwen2", "Llama's block with q/k/v biases, per-layer sliding windows (Qwen2, Qwen2.5)",
                     llama.projections, llama.kernels, llama.tensors, hf=HF, qkv_bias=True)
