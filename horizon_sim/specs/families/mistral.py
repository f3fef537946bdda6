"""Mistral (MistralForCausalLM): Llama's block with one sliding window on every layer (or none).

HF config: sliding_window -> layer_windows (null: full attention)."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import llama
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import HfFamily, defaults_with, one_window


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    return dict(layer_windows=one_window(cfg, where, n_layers))


def _export(spec) -> dict:
    if spec.mlp_bias or spec.qkv_bias or len(set(spec.layer_windows)) > 1:
        raise HorizonError(f"model {spec.name!r}: mistral has one sliding window on every layer and no biases "
                           f"(windows {sorted(set(spec.layer_windows))}, qkv_bias={spec.qkv_bias}, "
                           f"mlp_bias={spec.mlp_bias}); qwen2 windows layers apart")
    return {"sliding_window": spec.layer_windows[0] if spec.layer_windows else None}


PRESETS = (
    # mistralai/Mistral-7B-v0.3: vocab 32768, rope_theta 1e6, no sliding window, 32k context.
    dict(name="mistral-7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab=32768,
         norm_eps=1e-5, rope_theta=1e6, max_position=32768),
)

HF = HfFamily(
    "mistral", "MistralForCausalLM",
    defaults_with(intermediate_size=14336, num_key_value_heads=8, head_dim=None, max_position_embeddings=131072,
                  sliding_window=4096),
    frozenset({"sliding_window"}), _read, _export)

FAMILY = ModelFamily("mistral", "Llama's block with one sliding window on every layer (Mistral)",
                     llama.projections, llama.kernels, llama.tensors, hf=HF, presets=PRESETS)
