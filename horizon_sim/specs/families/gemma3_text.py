"""Gemma 3's language model (Gemma3ForCausalLM, model_type gemma3_text): Gemma 2's block (the
sandwich of Gemma's (1 + w) RMSNorms, a GELU-tanh gated MLP, queries scaled by
query_pre_attn_scalar ** -0.5, the embedding scaled by sqrt(hidden), tied head, pad token 0)
with per-head q/k norms (Gemma's, before RoPE) and, by default, no soft-capping; five sliding
layers to one global (layer_types, or sliding_window_pattern); and a RoPE base per layer type:
the global layers take rope_theta with its scaling, the sliding ones their own base, unscaled
(ModelSpec.rope_local_theta). RoPE's cost does not depend on its base: the planner prices it as
Gemma 2's block with Qwen3's q/k norms.

The executor keeps a RoPE table pair per base (ModelSpec.rope_table_count; the Schedule's
rope.cos and rope.sin stacked) and gives each block its layer type's (horizon_exec/runtime/
positions.py). The multimodal checkpoint (model_type gemma3: the 4B, 12B and 27B as published) is
read by its text_config (hf_config.WRAPPED_TYPES): this language model is planned and trained, and
a run carries the vision tower and projector unchanged into --save-hf
(horizon_exec/checkpoints/hf_wrapped.py).

HF config: Gemma2's fields, rope_parameters per layer type ({'full_attention': ...,
'sliding_attention': ...}; 4.x: rope_theta, rope_scaling and rope_local_base_freq), and
sliding_window_pattern; a scaled RoPE on the sliding layers is refused by name."""
from dataclasses import replace
from types import MappingProxyType

from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import Kernel, attention_kernels, block_tensors, dense_mlp_kernels
from horizon_sim.specs.families import gemma2
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import HfFamily, refuse_attention_bias, windows_of_types
from horizon_sim.specs.hf_values import as_bool, as_float, as_int

projections = gemma2.projections
DEFAULT_THETA, DEFAULT_LOCAL_THETA = 1000000.0, 10000.0  # Gemma3TextConfig.default_theta


def kernels(m):
    """Gemma 2's, with Qwen3's per-head q/k norms; every norm Gemma's (1 + w), in fp32."""
    gemma = dict(fp32_weight=True, unit_offset=True)
    norm1, *attn, attn_add = attention_kernels(m, qk_norm=True)
    norm2, *mlp, mlp_add = dense_mlp_kernels(m, gated=True)
    attn = [replace(k, **gemma) if k.kind == "rmsnorm" else
            replace(k, softcap=bool(m.attn_softcap)) if k.kind == "attention" else k for k in attn]
    return (replace(norm1, **gemma), *attn, Kernel("rmsnorm", "attention", m.hidden, **gemma), attn_add,
            replace(norm2, **gemma), *mlp, Kernel("rmsnorm", "mlp", m.hidden, **gemma), mlp_add)


def tensors(m):
    """q, k, v, o, the q/k norms, the MLP's, then the four norms (Gemma3DecoderLayer's order)."""
    return (*block_tensors(m, projections(m), norm_tensors=(), qk_norm=True),
            *((f"{n}.weight", (m.hidden,)) for n in gemma2.NORMS))


def _prepare(cfg: dict) -> dict:
    """rope_parameters per layer type -> the global layers' (which the shared reader reads) and
    the sliding layers' (_rope_local), as Gemma3TextConfig makes them: 4.x's rope_theta and
    rope_local_base_freq, else its defaults 1e6 and 1e4."""
    cfg = dict(cfg)
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and ("full_attention" in rp or "sliding_attention" in rp):
        full, local = dict(rp.get("full_attention") or {}), dict(rp.get("sliding_attention") or {})
    else:
        full, local = (dict(rp) if isinstance(rp, dict) else {}), {"rope_type": "default"}
    # a base missing from rope_parameters is the top-level one (configs converted from 4.x keep both)
    full.setdefault("rope_theta", cfg.get("rope_theta", DEFAULT_THETA))
    local.setdefault("rope_theta", cfg.get("rope_local_base_freq", DEFAULT_LOCAL_THETA))
    cfg["rope_theta"] = cfg.get("rope_theta", full["rope_theta"])
    cfg["rope_parameters"], cfg["_rope_local"] = full, local
    return cfg


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    refuse_attention_bias(cfg, "gemma3_text", where)
    if as_bool(cfg, "use_bidirectional_attention", where, False):
        raise HorizonError(f"{where}: use_bidirectional_attention = true (an encoder's attention) is not supported")
    local = cfg.get("_rope_local") or {}
    kind = local.get("rope_type", local.get("type", "default"))
    if kind != "default":
        raise HorizonError(f"{where}: rope_parameters.sliding_attention.rope_type = {kind!r}: a scaled RoPE on the "
                           "sliding layers is not supported (Gemma 3's are unscaled)")
    local_theta = as_float(local.get("rope_theta", DEFAULT_LOCAL_THETA), "rope_parameters.sliding_attention.rope_theta",
                           where, strict=False)
    types = cfg.get("layer_types")
    if types is None:  # 4.x's sliding_window_pattern, which 5.x saves as _sliding_window_pattern
        key = next((k for k in ("sliding_window_pattern", "_sliding_window_pattern") if cfg.get(k) is not None), None)
        every = as_int(cfg, key, where) if key else 6
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]
    w = as_int(cfg, "sliding_window", where) if cfg.get("sliding_window") is not None else 0
    return dict(layer_windows=windows_of_types(types, w, where, n_layers), rope_local_theta=local_theta,
                **gemma2.read_caps_and_scale(cfg, where))


def _export(spec) -> dict:
    from horizon_sim.specs.hf_export import rope_parameters_of  # here: hf_export reads the family registry
    local = {"rope_type": "default", "rope_theta": spec.rope_local_theta or spec.rope_theta}
    return {**gemma2.export_fields(spec, "gemma3_text"),
            "rope_parameters": {"full_attention": rope_parameters_of(spec), "sliding_attention": local}}


HF = HfFamily(
    "gemma3_text", "Gemma3ForCausalLM",
    MappingProxyType({**gemma2.HF.defaults,  # Gemma3TextConfig's: Gemma2Config's but these
                      "vocab_size": 262208, "max_position_embeddings": 131072, "final_logit_softcapping": None,
                      "attn_logit_softcapping": None, "use_bidirectional_attention": False}),
    frozenset({"hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
               "sliding_window", "layer_types", "attention_bias", "use_bidirectional_attention",
               "cache_implementation", "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern"}),
    _read, _export, aliases={"hidden_activation": "hidden_act"}, activations=("gelu_pytorch_tanh",),
    prepare=_prepare, drops=frozenset({"rope_theta", "rope_scaling"}))

def _gemma3(name, L, H, heads, kv, hd, F, window, vocab, positions, query_scale, scaling=None) -> dict:
    # five sliding layers to one global; RoPE bases 1e6 (global, with `scaling`) and 1e4 (sliding)
    return dict(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv, head_dim=hd, ffn_hidden=F,
                vocab=vocab, tied_embeddings=True, norm_eps=1e-6, max_position=positions, padding_idx=0,
                rope_theta=DEFAULT_THETA, rope_local_theta=DEFAULT_LOCAL_THETA, rope_scaling=scaling,
                layer_windows=tuple(0 if (i + 1) % 6 == 0 else window for i in range(L)), query_scale=query_scale)


LINEAR_8 = dict(kind="linear", factor=8.0)
PRESETS = (
    # google/gemma-3-1b-pt config.json, the text-only size (keras-hub gemma3 presets count its
    # 999,885,952 parameters): 26 layers of 1152, 4 heads of 256, 1 kv head, MLP 6912, a 512-token window.
    _gemma3("gemma-3-1b", 26, 1152, 4, 1, 256, 6912, 512, 262144, 32768, 256.0),
    # The language models of google/gemma-3-4b-pt, -12b-pt and -27b-pt (their config.json's text_config:
    # those checkpoints are multimodal; with their SigLIP vision tower these count the published
    # 4,300,079,472, 12,187,325,040 and 27,432,406,640, tests/test_model_presets.py): 1024-token
    # windows, global RoPE stretched 8x (linear), 131072 positions; 27B scales queries by 168.
    _gemma3("gemma-3-4b", 34, 2560, 8, 4, 256, 10240, 1024, 262208, 131072, 256.0, LINEAR_8),
    _gemma3("gemma-3-12b", 48, 3840, 16, 8, 256, 15360, 1024, 262208, 131072, 256.0, LINEAR_8),
    _gemma3("gemma-3-27b", 62, 5376, 32, 16, 128, 21504, 1024, 262208, 131072, 168.0, LINEAR_8),
)

FAMILY = ModelFamily("gemma3_text", "Gemma 2's sandwich block with per-head q/k norms and a RoPE base per layer "
                     "type (Gemma 3's language model)", projections, kernels, tensors, hf=HF, softcapping=True,
                     local_rope=True, presets=PRESETS)
