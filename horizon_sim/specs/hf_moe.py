"""The routing fields every MoE row (specs/families) shares (HF config.json <-> ModelSpec; the
families and their routing: specs/moe.py). Field mapping (HF name -> ModelSpec field):

    num_experts (qwen) / num_local_experts (mixtral) -> n_experts (qwen3_moe and mixtral accept
                                          either name: their classes alias one to the other, and
                                          transformers 5 writes qwen3_moe's as num_local_experts)
    num_experts_per_tok                -> experts_per_token
    router_aux_loss_coef, output_router_logits -> router_aux_loss_coef (the coefficient when
                                          output_router_logits is true, else 0: transformers
                                          adds the aux loss to the loss only then)
    decoder_sparse_step, mlp_only_layers: must be 1 and [] (every block an MoE block); other
        values (dense blocks among MoE ones) are refused by name.
    use_sliding_window / layer_types: refused when they turn a window on.

Each row adds its own (its module in specs/families): the experts' width (moe_intermediate_size, mixtral's
intermediate_size), norm_topk_prob, qwen2_moe's shared expert and qkv_bias, mixtral's
router_jitter_noise (must be 0: multiplicative noise on the router's input in training, which
the executor would have to reproduce) and its switchless sliding_window.
"""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_values import as_bool, as_float, as_int

REFUSED_TYPES = {
    "qwen3_next": "Qwen3-Next (gated delta-net layers)",
    "olmoe": "OLMoE", "jamba": "Jamba (Mamba layers)", "dbrx": "DBRX", "granitemoe": "Granite-MoE",
    "phimoe": "Phi-MoE", "llama4": "Llama 4", "deepseek_v32": "DeepSeek-V3.2",
}
"""MoE model types refused by name: their blocks differ from the families of specs/families."""


def refuse_window(mt: str, where: str) -> None:
    raise HorizonError(f"{where}: a sliding window in an MoE model ({mt}) is not supported")


def read(cfg: dict, mt: str, where: str, experts_key: str, aliased: bool, windows: bool = False) -> dict:
    """The routing's ModelSpec fields from a config with transformers' defaults filled in (cfg).
    experts_key: the class's name for the expert count; aliased: its class also accepts the
    other name (num_experts <-> num_local_experts); windows: its layers may slide (gpt-oss, whose
    row reads layer_types itself), else a window is refused."""
    if (step := cfg.get("decoder_sparse_step", 1)) != 1:
        raise HorizonError(f"{where}: decoder_sparse_step = {step!r}: dense blocks among MoE ones are not "
                           "supported (want 1: every block an MoE block)")
    if cfg.get("mlp_only_layers"):
        raise HorizonError(f"{where}: mlp_only_layers = {cfg['mlp_only_layers']!r}: dense blocks among MoE ones "
                           "are not supported (want [])")
    if as_bool(cfg, "use_sliding_window", where, False):
        refuse_window(mt, where)
    types = None if windows else cfg.get("layer_types")
    if types is not None and not isinstance(types, list):
        raise HorizonError(f"{where}: layer_types = {types!r} must be a list with 'full_attention' for each layer")
    if any(t != "full_attention" for t in types or ()):
        raise HorizonError(f"{where}: layer_types with sliding attention in an MoE model ({mt}) are not supported")
    if aliased:
        given = [k for k in ("num_experts", "num_local_experts") if cfg.get(k) is not None]
        if len(given) == 2 and cfg["num_experts"] != cfg["num_local_experts"]:
            raise HorizonError(f"{where}: num_experts = {cfg['num_experts']!r} and num_local_experts = "
                               f"{cfg['num_local_experts']!r} disagree (they name one field)")
        experts_key = given[0] if len(given) == 1 else experts_key
    coef = as_float(cfg.get("router_aux_loss_coef", 0.0), "router_aux_loss_coef", where, strict=False)
    return dict(n_experts=as_int(cfg, experts_key, where),
                experts_per_token=as_int(cfg, "num_experts_per_tok", where),
                router_aux_loss_coef=coef if as_bool(cfg, "output_router_logits", where, False) else 0.0)


def export(spec, experts_key: str) -> dict:
    """The routing's config keys for spec (experts_key: the class's name for the expert count)."""
    return {"num_experts_per_tok": spec.experts_per_token, "router_aux_loss_coef": spec.router_aux_loss_coef,
            "output_router_logits": spec.router_aux_loss_coef > 0, experts_key: spec.n_experts}
