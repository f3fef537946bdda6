"""Qwen2 / Qwen2.5 (Qwen2ForCausalLM): Llama's block with biases on q, k and v (never on o or
the MLP), and sliding windows per layer.

HF config: qkv_bias = True; use_sliding_window, sliding_window, max_window_layers, layer_types
-> layer_windows; use_mrope (multimodal RoPE) refused."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import llama
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import (QWEN_WINDOWS, WINDOW_FIELDS, HfFamily, defaults_with,
                                           export_windows_by_layer, windows_by_layer)


def _qwen25(name, L, H, heads, kv, F, vocab=152064, tied=False, ctx=131072):
    # Qwen/Qwen2.5-*: qkv bias, rms_norm_eps 1e-6, rope_theta 1e6, max_position_embeddings
    # 32768 (0.5B) or 131072 (7B and up); sliding window off (use_sliding_window false).
    return dict(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv, ffn_hidden=F, vocab=vocab,
                tied_embeddings=tied, norm_eps=1e-6, rope_theta=1e6, max_position=ctx)


PRESETS = (
    _qwen25("qwen2.5-0.5b", 24, 896, 14, 2, 4864, vocab=151936, tied=True, ctx=32768),
    _qwen25("qwen2.5-7b", 28, 3584, 28, 4, 18944),
    _qwen25("qwen2.5-14b", 48, 5120, 40, 8, 13824),
    _qwen25("qwen2.5-32b", 64, 5120, 40, 8, 27648),
    _qwen25("qwen2.5-72b", 80, 8192, 64, 8, 29568),
)


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
                     llama.projections, llama.kernels, llama.tensors, hf=HF, qkv_bias=True, presets=PRESETS)
