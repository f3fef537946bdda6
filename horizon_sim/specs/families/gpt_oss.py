"""gpt-oss (GptOssForCausalLM, model_type gpt_oss): OpenAI's open-weight MoE.

Attention: q, k, v and o with biases (attention_bias), grouped kv heads of head_dim 64, YaRN RoPE,
every other layer a 128-token sliding window (layer_types), and a learned sink per head
(self_attn.sinks): one more logit in each row's softmax that takes probability and gives no value.
SDPA cannot add it, so the attention runs in chunks of query rows (Kernel.sinks,
horizon_exec/model/softcap_attention.py).

MLP: a router with a bias (mlp.router: top-k of the logits, then a softmax over those k), and
stacked experts with biases stored (E, in, out) (mlp.experts.gate_up_proj (E, H, 2I), gate and up
interleaved in its columns, gate_up_proj_bias (E, 2I); down_proj (E, I, H), down_proj_bias (E, H)).
An expert's gate is clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
(u + 1) * g * sigmoid(alpha g) (ModelSpec.swiglu_alpha, swiglu_limit). Every RMSNorm multiplies
its weight in fp32 before casting back (Kernel.fp32_weight), as OLMo-2's does. Untied head.

HF config: num_local_experts (or num_experts) -> n_experts, num_experts_per_tok (and the
original release's duplicate experts_per_token, which must agree) -> experts_per_token,
intermediate_size -> expert_ffn_hidden and ffn_hidden, layer_types + sliding_window ->
layer_windows, attention_bias -> qkv_bias (o_proj's bias too), swiglu_alpha, swiglu_limit,
router_aux_loss_coef with output_router_logits. initial_context_length (the original release's
name for the YaRN context, which rope_parameters states) is not read by transformers either.
The hub's checkpoints store the experts as MXFP4 (quantization_config quant_method mxfp4): they are
dequantized on load (horizon_exec/checkpoints/hf_mxfp4.py), and a --save-hf writes bf16 or fp32
weights with no quantization_config."""
from dataclasses import replace

from horizon_sim.errors import HorizonError
from horizon_sim.specs import hf_moe
from horizon_sim.specs.block_parts import Kernel, Projection, attention_kernels, block_tensors
from horizon_sim.specs.families.family import ModelFamily, MoeTraits
from horizon_sim.specs.hf_families import MOE_DEFAULTS, HfFamily, defaults_with, layer_types, one_window_size, windows_of_types
from horizon_sim.specs.hf_values import as_bool, as_float, as_int

YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}
"""GptOssConfig's rope_parameters when the file gives none (its __post_init__ sets them)."""


def _prepare(cfg: dict) -> dict:
    """A config without RoPE parameters (rope_parameters and rope_scaling absent or null) has
    GptOssConfig's YaRN, at the rope_theta given (or the class's 150000)."""
    if cfg.get("rope_parameters") or cfg.get("rope_scaling"):
        return cfg
    return {**cfg, "rope_parameters": dict(YARN)}


def projections(m):
    """q, k, v, o (biases with attention_bias), the router (a bias always), the two expert stacks
    (biases always), in the order the forward runs them."""
    H, q, kv, b = m.hidden, m.q_dim, m.kv_dim, m.qkv_bias
    E, I = m.n_experts, m.expert_ffn_hidden
    return (Projection("self_attn.q_proj", H, q, b), Projection("self_attn.k_proj", H, kv, b),
            Projection("self_attn.v_proj", H, kv, b), Projection("self_attn.o_proj", q, H, b, inner=True),
            Projection("mlp.router", H, E, True),
            Projection("mlp.experts.gate_up_proj", H, 2 * I, True, experts=E, transposed=True),
            Projection("mlp.experts.down_proj", I, H, True, experts=E, transposed=True, inner=True))


def kernels(m):
    """Llama's attention half with sinks; the MoE half with gpt-oss's router and clamped SwiGLU;
    every norm multiplying its weight in fp32."""
    H, k = m.hidden, m.experts_per_token
    norm1, *attn, add1 = attention_kernels(m, qk_norm=False)
    attn = [replace(x, sinks=True) if x.kind == "attention" else x for x in attn]
    return (replace(norm1, fp32_weight=True), *attn, add1,
            Kernel("rmsnorm", "mlp", H, fan_out=2, output_saved=True, fp32_weight=True),
            Kernel("router", "mlp", m.n_experts, rows=k, aux_loss=m.router_aux_loss_coef > 0, topk_first=True,
                   renormalised=False),
            Kernel("dispatch", "mlp", k * H, rows=k, routed=True),
            Kernel("clamped_swiglu", "mlp", k * m.expert_ffn_hidden, routed=True),
            Kernel("combine", "mlp", k * H, rows=k, routed=True),
            Kernel("residual", "mlp", H))


def tensors(m):
    """The sinks first (a parameter of the attention module itself), then every projection's
    weight and bias, then the two norms: transformers' named_parameters order."""
    return (("self_attn.sinks", (m.n_heads,)), *block_tensors(m, projections(m)))


def _check(m) -> None:
    if m.ffn_hidden != m.expert_ffn_hidden:
        raise HorizonError(f"model gpt_oss: ffn_hidden={m.ffn_hidden} must equal expert_ffn_hidden="
                           f"{m.expert_ffn_hidden} (gpt-oss's experts are intermediate_size wide)")


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    routing = hf_moe.read(cfg, "gpt_oss", where, experts_key="num_local_experts", aliased=True, windows=True)
    if cfg.get("experts_per_token") is not None and cfg["experts_per_token"] != routing["experts_per_token"]:
        raise HorizonError(f"{where}: experts_per_token = {cfg['experts_per_token']!r} and num_experts_per_tok = "
                           f"{routing['experts_per_token']} disagree (transformers reads num_experts_per_tok)")
    types = cfg.get("layer_types")
    if types is None:  # GptOssConfig: sliding on the even layers
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    window = as_int(cfg, "sliding_window", where) if cfg.get("sliding_window") is not None else 0
    if window == 0 and "sliding_attention" in types:
        raise HorizonError(f"{where}: layer_types has sliding layers but sliding_window is null")
    I = as_int(cfg, "intermediate_size", where)
    return dict(**routing, expert_ffn_hidden=I, norm_topk_prob=True,
                layer_windows=windows_of_types(types, window, where, n_layers) if window else (),
                qkv_bias=as_bool(cfg, "attention_bias", where, True),
                swiglu_alpha=as_float(cfg["swiglu_alpha"], "swiglu_alpha", where, strict=False),
                swiglu_limit=as_float(cfg["swiglu_limit"], "swiglu_limit", where, strict=False))


def _export(spec) -> dict:
    return {**hf_moe.export(spec, "num_local_experts"), "head_dim": spec.hd, "attention_bias": spec.qkv_bias,
            "sliding_window": one_window_size(spec, "gpt_oss") or None, "layer_types": layer_types(spec),
            "swiglu_alpha": spec.swiglu_alpha, "swiglu_limit": spec.swiglu_limit}


def _preset(name: str, L: int, E: int) -> dict:
    # openai/gpt-oss-20b and -120b config.json (and the gpt-oss model card, arXiv 2508.10925):
    # 24 / 36 layers of 2880, 64 query heads of 64 and 8 kv heads, 32 / 128 experts of width 2880,
    # 4 per token, vocabulary 201088 (pad 199999), a 128-token window on every even layer, YaRN
    # (factor 32 over 4096, beta 32 / 1, untruncated) at base 150000, 131072 positions, RMSNorm
    # eps 1e-5, clamped SwiGLU (alpha 1.702, limit 7), router_aux_loss_coef 0.9 with
    # output_router_logits false (not added to the loss), untied. The card: 20.9B / 116.8B total,
    # 3.6B / 5.1B active per token.
    from horizon_sim.specs.rope import RopeScaling
    return dict(name=name, n_layers=L, hidden=2880, n_heads=64, n_kv_heads=8, head_dim=64,
                ffn_hidden=2880, vocab=201088, norm_eps=1e-5, rope_theta=150000.0, max_position=131072,
                rope_scaling=RopeScaling(kind="yarn", factor=32.0, original_max_position=4096, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False),
                layer_windows=(128, 0) * (L // 2), padding_idx=199999, qkv_bias=True, n_experts=E,
                experts_per_token=4, expert_ffn_hidden=2880, norm_topk_prob=True,
                swiglu_alpha=1.702, swiglu_limit=7.0)


PRESETS = (_preset("gpt-oss-20b", 24, 32), _preset("gpt-oss-120b", 36, 128))

HF = HfFamily(
    "gpt_oss", "GptOssForCausalLM",
    defaults_with(vocab_size=201088, hidden_size=2880, num_hidden_layers=36, num_attention_heads=64,
                  num_key_value_heads=8, head_dim=64, intermediate_size=2880, num_local_experts=128,
                  num_experts_per_tok=4, sliding_window=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
                  rope_theta=150000.0, rope_parameters=None, layer_types=None, attention_bias=True,
                  swiglu_alpha=1.702, swiglu_limit=7.0, **MOE_DEFAULTS),
    frozenset({"num_experts", "num_local_experts", "num_experts_per_tok", "experts_per_token", "output_router_logits",
               "router_aux_loss_coef", "sliding_window", "layer_types", "attention_bias", "swiglu_alpha",
               "swiglu_limit", "initial_context_length"}),
    _read, _export, prepare=_prepare)

FAMILY = ModelFamily("gpt_oss", "attention sinks, biased q/k/v/o, routed clamped-SwiGLU experts with biases (gpt-oss)",
                     projections, kernels, tensors, hf=HF, qkv_bias=True,
                     moe=MoeTraits(router_first=True, always_norm_topk=True, windows=True, stored_per_expert=False), check=_check,
                     attention_sinks=True, clamped_swiglu=True, presets=PRESETS)
