"""ModelSpec -> a transformers config dict (the inverse of hf_config.from_hf_config).

`transformers.AutoConfig.for_model(**d)` (or `LlamaConfig(**d)` / `Qwen2Config(**d)`) builds a
config whose model has exactly spec.total_params parameters. Plain-JSON only: no torch or
transformers import here.
"""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _hf_model_type(spec: ModelSpec) -> str:
    if spec.ffn_type != "gated" or spec.norm != "rmsnorm":
        raise HorizonError(f"model {spec.name!r} ({spec.ffn_type} MLP, {spec.norm}) has no "
                           "transformers equivalent; llama/qwen2 need a gated MLP and rmsnorm")
    if spec.qkv_bias and spec.mlp_bias:
        raise HorizonError(f"model {spec.name!r} has q/k/v and MLP biases; no transformers class "
                           "has exactly that (llama attention_bias also adds an o bias)")
    return "qwen2" if spec.qkv_bias else "llama"


def to_hf_config_dict(spec: ModelSpec) -> dict:
    """A config.json-style dict: model_type 'llama' (no biases, or MLP biases only) or 'qwen2'
    (q/k/v biases). rope_theta is written both top-level (transformers 4.x) and inside
    rope_parameters (transformers 5.x)."""
    mt = _hf_model_type(spec)
    d = {
        "model_type": mt,
        "architectures": [_ARCH[mt]],
        "_name_or_path": spec.name,
        "num_hidden_layers": spec.n_layers,
        "hidden_size": spec.hidden,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads,
        "intermediate_size": spec.ffn_hidden,
        "vocab_size": spec.vocab,
        "hidden_act": "silu",
        "tie_word_embeddings": spec.tied_embeddings,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
    }
    if spec.head_dim and spec.head_dim * spec.n_heads != spec.hidden:
        d["head_dim"] = spec.head_dim
    if mt == "llama":
        d["attention_bias"] = False
        d["mlp_bias"] = spec.mlp_bias
    else:
        d["use_sliding_window"] = False
    return d
