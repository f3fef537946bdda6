"""The MoE half of HF config.json <-> ModelSpec (hf_config.py reads, hf_export.py writes; the
families and their routing: specs/moe.py). Field mapping (HF name -> ModelSpec field):

    num_experts (qwen) / num_local_experts (mixtral) -> n_experts (qwen3_moe and mixtral accept
                                          either name: their classes alias one to the other, and
                                          transformers 5 writes qwen3_moe's as num_local_experts)
    num_experts_per_tok                -> experts_per_token
    moe_intermediate_size (qwen)       -> expert_ffn_hidden (mixtral: intermediate_size)
    shared_expert_intermediate_size    -> shared_expert_ffn_hidden (qwen2_moe; must be > 0)
    norm_topk_prob (qwen)              -> norm_topk_prob (mixtral: always true)
    router_aux_loss_coef, output_router_logits -> router_aux_loss_coef (the coefficient when
                                          output_router_logits is true, else 0: transformers
                                          adds the aux loss to the loss only then)
    qkv_bias (qwen2_moe)               -> qkv_bias
    decoder_sparse_step, mlp_only_layers: must be 1 and [] (every block an MoE block); other
        values (dense blocks among MoE ones) are refused by name.
    router_jitter_noise (mixtral): must be 0 (multiplicative noise on the router's input in
        training, which the executor would have to reproduce).
    use_sliding_window / sliding_window: refused when they turn a window on.
"""
from horizon_sim.errors import HorizonError

MOE_TYPES = ("qwen3_moe", "mixtral", "qwen2_moe")
READ_BY_TYPE = {
    "qwen3_moe": {"num_local_experts", "attention_bias", "use_sliding_window", "sliding_window", "max_window_layers", "decoder_sparse_step",
                  "moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob",
                  "output_router_logits", "router_aux_loss_coef", "mlp_only_layers"},
    "mixtral": {"num_experts", "sliding_window", "num_local_experts", "num_experts_per_tok", "output_router_logits",
                "router_aux_loss_coef", "router_jitter_noise"},
    "qwen2_moe": {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "decoder_sparse_step",
                  "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok",
                  "norm_topk_prob", "output_router_logits", "router_aux_loss_coef", "mlp_only_layers", "qkv_bias"},
}
ALIASED_EXPERTS = ("qwen3_moe", "mixtral")
"""Types whose config class maps num_experts <-> num_local_experts (attribute_map)."""
REFUSED_TYPES = {
    "deepseek_v2": "DeepSeek-V2 (multi-head latent attention and grouped routing)",
    "deepseek_v3": "DeepSeek-V3 (multi-head latent attention, sigmoid routing with a bias)",
    "gpt_oss": "gpt-oss (attention sinks, clamped SwiGLU with biases, MXFP4 experts)",
    "qwen3_next": "Qwen3-Next (gated delta-net layers)",
    "olmoe": "OLMoE", "jamba": "Jamba (Mamba layers)", "dbrx": "DBRX", "granitemoe": "Granite-MoE",
    "phimoe": "Phi-MoE", "llama4": "Llama 4", "deepseek_v32": "DeepSeek-V3.2",
}
"""MoE model types refused by name: their blocks differ from the three described here."""


def read(cfg: dict, mt: str, where: str, as_int, as_bool, as_float) -> dict:
    """ModelSpec MoE fields from a config with transformers' defaults filled in (cfg); the
    as_* helpers are hf_config's typed readers (one-line errors naming the key)."""
    if (step := cfg.get("decoder_sparse_step", 1)) != 1:
        raise HorizonError(f"{where}: decoder_sparse_step = {step!r}: dense blocks among MoE ones are not "
                           "supported (want 1: every block an MoE block)")
    if cfg.get("mlp_only_layers"):
        raise HorizonError(f"{where}: mlp_only_layers = {cfg['mlp_only_layers']!r}: dense blocks among MoE ones "
                           "are not supported (want [])")
    if as_bool(cfg, "use_sliding_window", where, False) or (mt == "mixtral" and cfg.get("sliding_window")):
        raise HorizonError(f"{where}: a sliding window in an MoE model ({mt}) is not supported")
    if any(t != "full_attention" for t in cfg.get("layer_types") or ()):
        raise HorizonError(f"{where}: layer_types with sliding attention in an MoE model ({mt}) are not supported")
    if mt == "mixtral" and as_float(cfg.get("router_jitter_noise", 0.0), "router_jitter_noise", where,
                                    strict=False) != 0.0:
        raise HorizonError(f"{where}: router_jitter_noise = {cfg['router_jitter_noise']!r}: router input noise "
                           "in training is not supported (want 0)")
    experts_key = "num_local_experts" if mt == "mixtral" else "num_experts"
    if mt in ALIASED_EXPERTS:
        given = [k for k in ("num_experts", "num_local_experts") if cfg.get(k) is not None]
        if len(given) == 2 and cfg["num_experts"] != cfg["num_local_experts"]:
            raise HorizonError(f"{where}: num_experts = {cfg['num_experts']!r} and num_local_experts = "
                               f"{cfg['num_local_experts']!r} disagree (they name one field)")
        experts_key = given[0] if len(given) == 1 else experts_key
    coef = as_float(cfg.get("router_aux_loss_coef", 0.0), "router_aux_loss_coef", where, strict=False)
    out = dict(moe_family=mt,
               n_experts=as_int(cfg, experts_key, where),
               experts_per_token=as_int(cfg, "num_experts_per_tok", where),
               router_aux_loss_coef=coef if as_bool(cfg, "output_router_logits", where, False) else 0.0)
    if mt == "mixtral":
        out.update(expert_ffn_hidden=as_int(cfg, "intermediate_size", where), norm_topk_prob=True)
    else:
        out.update(expert_ffn_hidden=as_int(cfg, "moe_intermediate_size", where),
                   norm_topk_prob=as_bool(cfg, "norm_topk_prob", where, False))
    if mt == "qwen2_moe":
        out.update(shared_expert_ffn_hidden=as_int(cfg, "shared_expert_intermediate_size", where),
                   qkv_bias=as_bool(cfg, "qkv_bias", where, True))
    return out


def export(spec) -> dict:
    """The config keys of spec's MoE block (spec.moe_family is its model_type)."""
    mt = spec.moe_family
    d = {"num_experts_per_tok": spec.experts_per_token, "router_aux_loss_coef": spec.router_aux_loss_coef,
         "output_router_logits": spec.router_aux_loss_coef > 0}
    if mt == "mixtral":
        return {**d, "num_local_experts": spec.n_experts, "router_jitter_noise": 0.0, "sliding_window": None}
    d.update(num_experts=spec.n_experts, moe_intermediate_size=spec.expert_ffn_hidden,
             norm_topk_prob=spec.norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False)
    if mt == "qwen2_moe":
        d.update(shared_expert_intermediate_size=spec.shared_expert_ffn_hidden, qkv_bias=spec.qkv_bias)
    return d
