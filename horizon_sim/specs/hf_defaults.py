"""What transformers assumes for a config.json key that is absent, per supported model_type:
the keyword defaults of LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig,
MixtralConfig and Qwen2MoeConfig (transformers 5;
tests/test_hf_config_defaults.py checks this table against the installed classes).

hf_config fills every absent key from here before reading the file, so a config that leaves
a field out trains the model transformers would build from it (a Mistral config without
`sliding_window` gets the 4096-token window, not full attention; a Qwen2 config without
`num_key_value_heads` gets 32 of them, not one per query head). An explicit null keeps its
own meaning (num_key_value_heads null: one per query head; sliding_window null: none).
The sizes (REQUIRED) stay required: a config without hidden_size is broken, not a 4096-wide
model, and refusing it by name is not a silent difference.
"""

_COMMON = {
    "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_theta": 10000.0, "attention_dropout": 0.0,
}

HF_DEFAULTS: dict[str, dict] = {
    "llama": {**_COMMON, "intermediate_size": 11008, "num_key_value_heads": None, "head_dim": None,
              "max_position_embeddings": 2048, "attention_bias": False, "mlp_bias": False},
    "mistral": {**_COMMON, "intermediate_size": 14336, "num_key_value_heads": 8, "head_dim": None,
                "max_position_embeddings": 131072, "sliding_window": 4096},
    "qwen2": {**_COMMON, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
              "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 4096,
              "max_window_layers": 28},
    "qwen3": {**_COMMON, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
              "head_dim": 128, "max_position_embeddings": 32768, "attention_bias": False,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3_moe": {**_COMMON, "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 6144, "num_key_value_heads": 4,
                  "max_position_embeddings": 32768, "attention_bias": False, "use_sliding_window": False,
                  "sliding_window": 4096, "decoder_sparse_step": 1, "moe_intermediate_size": 768,
                  "num_experts_per_tok": 8, "num_experts": 128, "norm_topk_prob": False,
                  "output_router_logits": False, "router_aux_loss_coef": 0.001, "mlp_only_layers": None},
    "mixtral": {**_COMMON, "intermediate_size": 14336, "num_key_value_heads": 8, "head_dim": None,
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None,
                "num_experts_per_tok": 2, "num_local_experts": 8, "output_router_logits": False,
                "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0},
    "qwen2_moe": {**_COMMON, "vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 24,
                  "num_attention_heads": 16, "intermediate_size": 5632, "num_key_value_heads": 16,
                  "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 4096,
                  "max_window_layers": 28, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
                  "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001,
                  "mlp_only_layers": None, "qkv_bias": True},
}
"""{model_type: {config key: the value transformers uses when the key is absent}}. rope_theta
is the classes' default_theta (transformers 5 keeps it inside rope_parameters)."""


REQUIRED = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_experts", "num_local_experts", "num_experts_per_tok",
                      "moe_intermediate_size", "shared_expert_intermediate_size"})
"""Keys hf_config refuses to guess (the model's sizes, the experts' among them)."""


def with_hf_defaults(cfg: dict, model_type: str) -> dict:
    """cfg with every absent key of its family but the sizes filled in as transformers fills it."""
    return {**{k: v for k, v in HF_DEFAULTS[model_type].items() if k not in REQUIRED}, **cfg}
