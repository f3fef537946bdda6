"""ModelSpec -> a transformers config dict (the inverse of hf_config.from_hf_config).

The generic writer: the keys every family shares are written here, the class and its own keys
by the row of the spec's family (specs/families/<name>.py). `transformers.AutoConfig.for_model(**d)` (or
`LlamaConfig(**d)` / `Qwen2Config(**d)`) builds a config whose model has exactly
spec.total_params parameters. Plain-JSON only: no torch or transformers import here.
"""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import family
from horizon_sim.specs.model import ModelSpec

# RopeScaling field -> transformers' rope_parameters key, per kind (what its validators accept).
_ROPE_OUT = {
    "linear": {"factor": "factor"},
    "dynamic": {"factor": "factor"},
    "llama3": {"factor": "factor", "low_freq_factor": "low_freq_factor",
               "high_freq_factor": "high_freq_factor", "original_max_position": "original_max_position_embeddings"},
    "yarn": {"factor": "factor", "original_max_position": "original_max_position_embeddings",
             "beta_fast": "beta_fast", "beta_slow": "beta_slow", "truncate": "truncate"},
    "longrope": {"original_max_position": "original_max_position_embeddings"},
}


def _row(spec: ModelSpec):
    row = family(spec.family).hf
    if row is None:
        raise HorizonError(f"model {spec.name!r}: family {spec.family!r} has no transformers config Horizon "
                           "writes (it is planned only)")
    return row


def rope_parameters_of(spec: ModelSpec, partial: bool = False) -> dict:
    """spec's RoPE as transformers 5's rope_parameters (Gemma 3 writes it per layer type)."""
    d = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if partial:  # written even at 1: GPT-NeoX's class assumes 0.25 when it is absent
        d["partial_rotary_factor"] = spec.rotary_fraction
    s = spec.rope_scaling
    if s is not None:
        d["rope_type"] = s.kind
        d.update({key: getattr(s, f) for f, key in _ROPE_OUT[s.kind].items()})
        if s.kind == "longrope":
            d["short_factor"], d["long_factor"] = list(s.short_factor), list(s.long_factor)
            d.update({k: getattr(s, k) for k in ("factor", "attention_factor") if getattr(s, k)})
        if s.kind == "yarn":
            if s.attention_factor:
                d["attention_factor"] = s.attention_factor
            if s.mscale and s.mscale_all_dim:
                d["mscale"], d["mscale_all_dim"] = s.mscale, s.mscale_all_dim
    return d


def to_hf_config_dict(spec: ModelSpec) -> dict:
    """A config.json-style dict of the class of spec's family (whose row refuses what its class
    cannot express: e.g. q/k/v biases in llama, windows that differ by layer in mistral). rope_theta is written both top-level
    (transformers 4.x) and inside rope_parameters (transformers 5.x), a rope scaling both as
    rope_parameters and as 4.x's rope_scaling."""
    row = _row(spec)
    if spec.rotary_fraction != 1 and not row.partial_rotary:
        raise HorizonError(f"model {spec.name!r}: {row.model_type} rotates every dimension of a head; "
                           f"rotary_fraction={spec.rotary_fraction} has no {row.model_type} config")
    d = {
        "model_type": row.model_type,
        "architectures": [row.architecture],
        "_name_or_path": spec.name,
        "num_hidden_layers": spec.n_layers,
        "hidden_size": spec.hidden,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads,
        "intermediate_size": spec.ffn_hidden,
        "vocab_size": spec.vocab,
        "hidden_act": spec.hidden_act or row.activations[0],  # the family's own: silu, gelu_new (gpt2), gelu (gpt_neox)
        "tie_word_embeddings": spec.tied_embeddings,
        "rms_norm_eps": spec.norm_eps,
        "initializer_range": spec.init_std,
        "pad_token_id": spec.padding_idx,  # written even when null: phi3's class default is 32000
        "rope_theta": spec.rope_theta,
        "rope_parameters": rope_parameters_of(spec, row.partial_rotary),
    }
    if spec.rope_scaling is not None:
        d["rope_scaling"] = {k: v for k, v in d["rope_parameters"].items() if k != "rope_theta"}
    # always written (0 = not given): absent, transformers would assume its class default
    d["max_position_embeddings"] = spec.max_position
    if spec.head_dim and spec.head_dim * spec.n_heads != spec.hidden:
        d["head_dim"] = spec.hd  # the classes default to hidden // heads (qwen3's row always writes it)
    d.update(row.export(spec))
    return {row.own_key(k): v for k, v in d.items() if k not in row.drops}
