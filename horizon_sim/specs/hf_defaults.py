"""What transformers assumes for a config.json key that is absent, per supported model_type:
the keyword defaults of LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig,
MixtralConfig and Qwen2MoeConfig (transformers 5), each held in its family's row (specs/families);
tests/test_hf_config_defaults.py checks them against the installed classes.

hf_config fills every absent key from here before reading the file, so a config that leaves
a field out trains the model transformers would build from it (a Mistral config without
`sliding_window` gets the 4096-token window, not full attention; a Qwen2 config without
`num_key_value_heads` gets 32 of them, not one per query head). An explicit null keeps its
own meaning (num_key_value_heads null: one per query head; sliding_window null: none).
The sizes (REQUIRED) stay required: a config without hidden_size is broken, not a 4096-wide
model, and refusing it by name is not a silent difference.
"""
from horizon_sim.specs.families import HF_ROWS

HF_DEFAULTS: dict[str, dict] = {mt: dict(f.defaults) for mt, f in HF_ROWS.items()}
"""{model_type: {config key: the value transformers uses when the key is absent}}. rope_theta
is the classes' default_theta (transformers 5 keeps it inside rope_parameters)."""


REQUIRED = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_experts", "num_local_experts", "num_experts_per_tok",
                      "moe_intermediate_size", "shared_expert_intermediate_size"})
"""Keys hf_config refuses to guess (the model's sizes, the experts' among them)."""


def with_hf_defaults(cfg: dict, model_type: str) -> dict:
    """cfg with every absent key of its family but the sizes filled in as transformers fills it."""
    return {**{k: v for k, v in HF_ROWS[model_type].defaults.items() if k not in REQUIRED}, **cfg}
