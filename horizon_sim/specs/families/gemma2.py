"""Gemma 2 (Gemma2ForCausalLM, model_type gemma2): RMSNorm before and after attention and before
and after the MLP (the sandwich: input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
post_feedforward_layernorm), q/k/v/o without biases, RoPE, sliding and global layers alternating
(layer_types, or every even layer sliding), attention scores soft-capped (attn_logit_softcapping)
and scaled by query_pre_attn_scalar ** -0.5, a gated GELU-tanh MLP, logits soft-capped
(final_logit_softcapping), the embedding scaled by sqrt(hidden), tied head, pad token 0.

Its norms keep their fp32 (1 + w) per call (Kernel.unit_offset) and multiply in fp32
(fp32_weight); its GELU-tanh gate is priced as SiLU's (the same bytes and saved tensors); its
attention, soft-capped, runs on the CPU backend in chunks of query rows (Kernel.softcap; its
temporaries are work.softcap_attention_bytes), priced by the attention's FLOPs at the calibrated
SDPA rate plus its fp32 passes over each chunk's scores (work.softcap_elementwise_bytes); a GPU
runs it as one fused kernel (flex_attention), priced at softcap_attention_TFLOPs (sim/costs.py;
the device peak still counts the chunks' scores, an upper bound there). The logits' soft-cap
keeps the chunk's tanh beside the loss (work.head_temp_peak_bytes); the embedding's scale is not priced (one multiply per row).

HF config: hidden_activation (gelu_pytorch_tanh), head_dim, query_pre_attn_scalar ->
query_scale, attn_logit_softcapping -> attn_softcap, final_logit_softcapping -> logit_softcap,
sliding_window and layer_types -> layer_windows; attention_bias and use_bidirectional_attention
true are refused by name."""
from dataclasses import replace
from types import MappingProxyType

from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import (Kernel, attention_kernels, attention_projections, block_tensors,
                                           dense_mlp_kernels, gated_mlp_projections)
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import (HfFamily, layer_types, one_window_size, refuse_attention_bias,
                                           windows_of_types)
from horizon_sim.specs.hf_values import as_bool, as_float, as_int

NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def projections(m):
    return (*attention_projections(m, False), *gated_mlp_projections(m, False))


def kernels(m):
    """The Llama halves with a norm after each (on the half's output, before the residual add);
    every norm Gemma's (1 + w), in fp32; the attention's scores soft-capped."""
    gemma = dict(fp32_weight=True, unit_offset=True)
    norm1, *attn, attn_add = attention_kernels(m, qk_norm=False)
    norm2, *mlp, mlp_add = dense_mlp_kernels(m, gated=True)
    attn = [replace(k, softcap=bool(m.attn_softcap)) if k.kind == "attention" else k for k in attn]
    return (replace(norm1, **gemma), *attn, Kernel("rmsnorm", "attention", m.hidden, **gemma), attn_add,
            replace(norm2, **gemma), *mlp, Kernel("rmsnorm", "mlp", m.hidden, **gemma), mlp_add)


def tensors(m):
    return (*block_tensors(m, projections(m), norm_tensors=()), *((f"{n}.weight", (m.hidden,)) for n in NORMS))


def _windows(cfg: dict, where: str, n_layers: int) -> tuple[int, ...]:
    """Gemma2Config: layer_types, or every even layer sliding; sliding layers take sliding_window."""
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    w = as_int(cfg, "sliding_window", where) if cfg.get("sliding_window") is not None else 0
    return windows_of_types(types, w, where, n_layers)


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    refuse_attention_bias(cfg, "gemma2", where)
    if as_bool(cfg, "use_bidirectional_attention", where, False):
        raise HorizonError(f"{where}: use_bidirectional_attention = true (an encoder's attention) is not supported")
    return dict(layer_windows=_windows(cfg, where, n_layers), **read_caps_and_scale(cfg, where))


def read_caps_and_scale(cfg: dict, where: str) -> dict:
    """The soft-caps (null: none) and query_pre_attn_scalar, as ModelSpec fields (Gemma 2 and 3)."""
    cap = {k: as_float(cfg[k], k, where, strict=False) if cfg.get(k) is not None else 0.0
           for k in ("attn_logit_softcapping", "final_logit_softcapping")}
    return dict(attn_softcap=cap["attn_logit_softcapping"], logit_softcap=cap["final_logit_softcapping"],
                query_scale=as_float(cfg["query_pre_attn_scalar"], "query_pre_attn_scalar", where, strict=False))


def export_fields(spec, mt: str = "gemma2") -> dict:
    """What Gemma2Config and Gemma3TextConfig write beyond the shared fields, but RoPE."""
    q = spec.query_scale or spec.hd
    return {"head_dim": spec.hd, "query_pre_attn_scalar": int(q) if q == int(q) else q,  # an int in the classes
            "attn_logit_softcapping": spec.attn_softcap or None, "final_logit_softcapping": spec.logit_softcap or None,
            "sliding_window": one_window_size(spec, mt) or None, "attention_bias": False,
            "layer_types": layer_types(spec)}


HF = HfFamily(
    "gemma2", "Gemma2ForCausalLM",
    MappingProxyType(dict(  # Gemma2Config's (its hidden_activation aliased to the shared hidden_act)
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, hidden_act="gelu_pytorch_tanh", max_position_embeddings=8192,
        initializer_range=0.02, rms_norm_eps=1e-6, pad_token_id=0, tie_word_embeddings=True, attention_bias=False,
        attention_dropout=0.0, query_pre_attn_scalar=256, sliding_window=4096, layer_types=None,
        final_logit_softcapping=30.0, attn_logit_softcapping=50.0, use_bidirectional_attention=None)),
    frozenset({"hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
               "sliding_window", "layer_types", "attention_bias", "use_bidirectional_attention",
               "cache_implementation"}),
    _read, export_fields, aliases={"hidden_activation": "hidden_act"}, activations=("gelu_pytorch_tanh",))

PRESETS = (
    # Gemma2Config's defaults, which are google/gemma-2-2b's shape: 26 layers of 2304, 8 heads of 256, 4 kv
    # heads, MLP 9216, vocab 256000, a 4096-token window on every even layer, soft-caps 50 / 30, 8192 positions.
    dict(name="gemma-2-2b", n_layers=26, hidden=2304, n_heads=8, n_kv_heads=4, head_dim=256, ffn_hidden=9216,
         vocab=256000, tied_embeddings=True, norm_eps=1e-6, max_position=8192, padding_idx=0,
         layer_windows=(4096, 0) * 13, attn_softcap=50.0, logit_softcap=30.0, query_scale=256.0),
    # google/gemma-2-9b and -27b config.json (the Gemma 2 report's shapes; keras-hub gemma2 presets
    # count 9,241,705,984 and 27,227,128,320 parameters): 42 layers of 3584 with 16 heads of 256 and 8
    # kv heads, MLP 14336; 46 layers of 4608 with 32 heads of 128 and 16 kv heads, MLP 36864, queries
    # scaled by 144 ** -0.5; both 8192 positions, a 4096-token window every other layer, soft-caps 50 / 30.
    dict(name="gemma-2-9b", n_layers=42, hidden=3584, n_heads=16, n_kv_heads=8, head_dim=256, ffn_hidden=14336,
         vocab=256000, tied_embeddings=True, norm_eps=1e-6, max_position=8192, padding_idx=0,
         layer_windows=(4096, 0) * 21, attn_softcap=50.0, logit_softcap=30.0, query_scale=256.0),
    dict(name="gemma-2-27b", n_layers=46, hidden=4608, n_heads=32, n_kv_heads=16, head_dim=128, ffn_hidden=36864,
         vocab=256000, tied_embeddings=True, norm_eps=1e-6, max_position=8192, padding_idx=0,
         layer_windows=(4096, 0) * 23, attn_softcap=50.0, logit_softcap=30.0, query_scale=144.0),
)

FAMILY = ModelFamily("gemma2", "sandwich RMSNorms, soft-capped attention and logits, GELU-tanh MLP (Gemma 2)",
                     projections, kernels, tensors, hf=HF, softcapping=True, presets=PRESETS)
