"""Mixtral (MixtralForCausalLM): Llama's attention, then an MoE MLP (specs/moe.py) whose router
(mlp.gate) precedes the experts in transformers' order, always renormalises its top-k and returns
the weights in fp32; the experts are intermediate_size wide.

HF config: the routing fields (hf_moe.py), intermediate_size -> expert_ffn_hidden (and
ffn_hidden); a sliding window and router_jitter_noise other than 0 refused."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs import hf_moe
from horizon_sim.specs.block_parts import attention_kernels, attention_projections, block_tensors, moe_kernels, moe_projections
from horizon_sim.specs.families.family import ModelFamily, MoeTraits
from horizon_sim.specs.hf_families import MOE_DEFAULTS, HfFamily, defaults_with
from horizon_sim.specs.hf_values import as_float, as_int


def projections(m):
    return (*attention_projections(m, False), *moe_projections(m, router_first=True))


def kernels(m):
    return (*attention_kernels(m, qk_norm=False), *moe_kernels(m))


def tensors(m):
    return block_tensors(m, projections(m))


def _check(m) -> None:
    if m.ffn_hidden != m.expert_ffn_hidden:
        raise HorizonError(f"model mixtral: ffn_hidden={m.ffn_hidden} must equal expert_ffn_hidden="
                           f"{m.expert_ffn_hidden} (Mixtral's experts are intermediate_size wide)")
    if m.qkv_bias:
        raise HorizonError("model mixtral: qkv_bias=True; only qwen2_moe has q/k/v biases alone")


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    if cfg.get("sliding_window"):
        hf_moe.refuse_window("mixtral", where)
    if as_float(cfg.get("router_jitter_noise", 0.0), "router_jitter_noise", where, strict=False) != 0.0:
        raise HorizonError(f"{where}: router_jitter_noise = {cfg['router_jitter_noise']!r}: router input noise "
                           "in training is not supported (want 0)")
    routing = hf_moe.read(cfg, "mixtral", where, experts_key="num_local_experts", aliased=True)
    return dict(**routing, expert_ffn_hidden=as_int(cfg, "intermediate_size", where), norm_topk_prob=True)


PRESETS = (
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts of width 14336 (intermediate_size),
    # top-2 renormalised, rope_theta 1e6, 32768 positions, no sliding window, untied.
    dict(name="mixtral-8x7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab=32000,
         norm_eps=1e-5, rope_theta=1e6, max_position=32768, n_experts=8, experts_per_token=2,
         expert_ffn_hidden=14336, norm_topk_prob=True),
)

HF = HfFamily(
    "mixtral", "MixtralForCausalLM",
    defaults_with(intermediate_size=14336, num_key_value_heads=8, head_dim=None, max_position_embeddings=131072,
                  rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None, num_experts_per_tok=2, num_local_experts=8,
                  router_jitter_noise=0.0, **MOE_DEFAULTS),
    frozenset({"num_experts", "sliding_window", "num_local_experts", "num_experts_per_tok",
               "output_router_logits", "router_aux_loss_coef", "router_jitter_noise"}),
    _read, lambda s: {**hf_moe.export(s, "num_local_experts"), "router_jitter_noise": 0.0, "sliding_window": None})

FAMILY = ModelFamily("mixtral", "Llama's attention, routed SwiGLU experts, fp32 top-k weights (Mixtral)",
                     projections, kernels, tensors, hf=HF,
                     moe=MoeTraits(router_first=True, fp32_routing_weights=True, always_norm_topk=True), check=_check,
                     presets=PRESETS)
