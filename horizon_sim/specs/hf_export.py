"""ModelSpec -> a transformers config dict (the inverse of hf_config.from_hf_config).

`transformers.AutoConfig.for_model(**d)` (or `LlamaConfig(**d)` / `Qwen2Config(**d)`) builds a
config whose model has exactly spec.total_params parameters. Plain-JSON only: no torch or
transformers import here.
"""
from horizon_sim.errors import HorizonError
from horizon_sim.specs import hf_moe
from horizon_sim.specs.model import ModelSpec

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
         "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
         "qwen2_moe": "Qwen2MoeForCausalLM"}
# RopeScaling field -> transformers' rope_parameters key, per kind (what its validators accept).
_ROPE_OUT = {
    "linear": {"factor": "factor"},
    "dynamic": {"factor": "factor"},
    "llama3": {"factor": "factor", "low_freq_factor": "low_freq_factor",
               "high_freq_factor": "high_freq_factor", "original_max_position": "original_max_position_embeddings"},
    "yarn": {"factor": "factor", "original_max_position": "original_max_position_embeddings",
             "beta_fast": "beta_fast", "beta_slow": "beta_slow", "truncate": "truncate"},
}


def _hf_model_type(spec: ModelSpec) -> str:
    if spec.ffn_type != "gated" or spec.norm != "rmsnorm":
        raise HorizonError(f"model {spec.name!r} ({spec.ffn_type} MLP, {spec.norm}) has no "
                           "transformers equivalent; llama/qwen2 need a gated MLP and rmsnorm")
    if spec.moe_family:
        return spec.moe_family  # ModelSpec checked the block is that family's (specs/moe.py)
    if spec.qk_norm:
        if spec.qkv_bias or spec.mlp_bias:
            raise HorizonError(f"model {spec.name!r}: q/k norms with biases have no transformers class "
                               "(qwen3's attention_bias also adds an o bias)")
        return "qwen3"  # windows any subset of layers, as qwen2
    if spec.qkv_bias and spec.mlp_bias:
        raise HorizonError(f"model {spec.name!r} has q/k/v and MLP biases; no transformers class "
                           "has exactly that (llama attention_bias also adds an o bias)")
    if spec.qkv_bias:
        return "qwen2"  # Qwen2 windows any subset of layers (layer_types)
    if spec.layer_windows:
        if spec.mlp_bias or len(set(spec.layer_windows)) != 1:
            raise HorizonError(f"model {spec.name!r}: sliding windows that differ by layer, or with MLP "
                               "biases, have no transformers class without q/k/v biases (qwen2 has them)")
        return "mistral"  # one window on every layer
    return "llama"


def _rope_parameters(spec: ModelSpec) -> dict:
    d = {"rope_type": "default", "rope_theta": spec.rope_theta}
    s = spec.rope_scaling
    if s is not None:
        d["rope_type"] = s.kind
        d.update({key: getattr(s, f) for f, key in _ROPE_OUT[s.kind].items()})
        if s.kind == "yarn":
            if s.attention_factor:
                d["attention_factor"] = s.attention_factor
            if s.mscale and s.mscale_all_dim:
                d["mscale"], d["mscale_all_dim"] = s.mscale, s.mscale_all_dim
    return d


def to_hf_config_dict(spec: ModelSpec) -> dict:
    """A config.json-style dict: model_type 'llama' (no biases, or MLP biases only), 'qwen2'
    (q/k/v biases) or 'mistral' (one sliding window on every layer). rope_theta is written both
    top-level (transformers 4.x) and inside rope_parameters (transformers 5.x), a rope scaling
    both as rope_parameters and as 4.x's rope_scaling."""
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
        "initializer_range": spec.init_std,
        "rope_theta": spec.rope_theta,
        "rope_parameters": _rope_parameters(spec),
    }
    if spec.rope_scaling is not None:
        d["rope_scaling"] = {k: v for k, v in d["rope_parameters"].items() if k != "rope_theta"}
    # always written (0 = not given): absent, transformers would assume its class default
    d["max_position_embeddings"] = spec.max_position
    if spec.moe_family:
        d.update(hf_moe.export(spec))
        if mt == "qwen3_moe":
            d["attention_bias"] = False
        if spec.head_dim and spec.head_dim * spec.n_heads != spec.hidden:
            d["head_dim"] = spec.hd  # the MoE classes default to hidden // heads
        return d
    if (spec.head_dim and spec.head_dim * spec.n_heads != spec.hidden) or mt == "qwen3":
        d["head_dim"] = spec.hd  # Qwen3Config's default is 128, not hidden // heads: always written
    if mt in ("llama", "qwen3"):
        d["attention_bias"] = False
    if mt == "llama":
        d["mlp_bias"] = spec.mlp_bias
    elif mt == "mistral":
        d["sliding_window"] = spec.layer_windows[0]
    elif spec.layer_windows:
        w = max(spec.layer_windows)
        if any(x not in (0, w) for x in spec.layer_windows):
            raise HorizonError(f"model {spec.name!r}: qwen2 has one sliding window size, the layers "
                               f"want {sorted(set(spec.layer_windows))}")
        d.update(use_sliding_window=True, sliding_window=w,
                 layer_types=["sliding_attention" if x else "full_attention" for x in spec.layer_windows])
    else:
        d["use_sliding_window"] = False
    return d
