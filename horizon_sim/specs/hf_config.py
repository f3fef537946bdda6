"""Read a local Hugging Face `config.json` into a ModelSpec (no transformers import, no network).

The generic reader: what differs by model_type (llama, qwen2, mistral, qwen3 and the MoE ones
qwen3_moe, mixtral, qwen2_moe) is that family's row (specs/families/<model_type>.py), which this file reads
(DeepSeek and other MoE types are refused by name). Every field of the file is
accounted for: it is read into the spec (READ here, the row's `reads` there), or listed in
IGNORED (it does not change what a training step computes), or refused with its name. A field
we do not know is refused too, so nothing that changes the model is ever dropped without a word.
Shared field mapping (HF name -> ModelSpec field):

    num_hidden_layers   -> n_layers          (required)
    hidden_size         -> hidden            (required)
    num_attention_heads -> n_heads           (required)
    num_key_value_heads -> n_kv_heads        (null: num_attention_heads)
    head_dim            -> head_dim          (0 when absent/null or equal to hidden // heads)
    intermediate_size   -> ffn_hidden        (required; always a gated SiLU MLP)
    vocab_size          -> vocab             (required)
    tie_word_embeddings -> tied_embeddings
    rms_norm_eps        -> norm_eps
    initializer_range   -> init_std          (the std of a random init)
    max_position_embeddings -> max_position  (dynamic RoPE and yarn read it)
    rope_parameters (transformers 5) or rope_scaling + rope_theta (4.x) -> rope_theta and
                           rope_scaling (linear, dynamic, yarn, llama3; see specs/rope.py)

Biases, q/k norms, sliding windows and experts are per family (specs/families). An absent key
takes the value transformers' config class gives it (the row's defaults, filled in by
hf_defaults.py: e.g. a Mistral config without sliding_window has the 4096-token window).

Refused: attention dropout, partial rotary, rope types other than the four above, per-layer
rope parameters, quantized checkpoints, code from the hub (auto_map), and any field of another
architecture (logit soft-capping, qk norms, experts, ...).
"""
import json
import os
from dataclasses import replace
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.safe_read import read_json
from horizon_sim.specs.hf_cache import looks_like_model_id, resolve_model_dir
from horizon_sim.specs import hf_moe
from horizon_sim.specs.hf_defaults import with_hf_defaults
from horizon_sim.specs.families import FAMILIES, HF_ROWS
from horizon_sim.specs.hf_values import as_bool, as_float, as_int
from horizon_sim.specs.model import MAX_NORM_EPS, ModelSpec
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.rope import ROPE_KINDS, RopeScaling

SUPPORTED_MODEL_TYPES = tuple(HF_ROWS)
_MOE_TYPES = tuple(mt for mt in HF_ROWS if FAMILIES[mt].is_moe)
REFUSED_DENSE: dict[str, str] = {}
"""Dense model types refused by name with what they are (the MoE ones: hf_moe.REFUSED_TYPES)."""
WRAPPED_TYPES = {"gemma3": "gemma3_text"}
"""Multimodal model types whose language model (its text_config, of the model type given) is what
Horizon plans and trains; the vision tower and projector are not planned, and a run carries their
tensors unchanged into --save-hf (horizon_exec/checkpoints/hf_wrapped.py)."""
_DEFAULT_ROPE_THETA = 10000.0  # default_theta of all three HF config classes

# Read into the spec (the shared ones; per model type: each family's `reads`). Public with IGNORED:
# together they are every field this reader knows, which tests/test_hf_config_fields.py holds
# against transformers'.
READ = {"model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "rms_norm_eps",
        "hidden_act", "max_position_embeddings", "rope_theta", "rope_parameters", "rope_scaling",
        "attention_dropout", "initializer_range", "pad_token_id"}
READ_BY_TYPE = {mt: f.reads for mt, f in HF_ROWS.items()}
# Fields that do not change what a causal-LM training step computes: names and versions,
# inference and generation settings, the scale of transformers' own random init, token ids
# (the tokenizer's business), classification-head labels, and pretraining_tp (4.x: each
# projection sliced into that many matmuls summed back, the same product; unused in 5.x).
IGNORED = frozenset({
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict", "torchscript",
    "id2label", "label2id", "num_labels", "problem_type", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "pretraining_tp",
    "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "tokenizer_class", "prefix", "task_specific_params", "finetuning_task",
    "_attn_implementation", "_attn_implementation_autoset", "attn_implementation",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature",
    "top_k", "top_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "num_return_sequences", "use_bfloat16", "tie_encoder_decoder", "pruned_heads",
})
# Fields other architectures use to change the model, with what they mean: refused by name
# with a reason rather than as merely unknown.
_FOREIGN = {
    "quantization_config": "a quantized checkpoint (Horizon trains full-precision weights)",
    "auto_map": "model code from the hub (trust_remote_code), not transformers' own class",
    "partial_rotary_factor": "partial rotary embeddings",
    "attn_logit_softcapping": "attention logit soft-capping",
    "final_logit_softcapping": "final logit soft-capping",
    "query_pre_attn_scalar": "a custom attention scale",
    "use_qk_norm": "q/k normalisation", "qk_norm": "q/k normalisation",
    "num_experts": "mixture of experts", "num_local_experts": "mixture of experts",
    "num_experts_per_tok": "mixture of experts",
    "attention_chunk_size": "chunked attention",
    "embedding_multiplier": "a scaled embedding", "logits_scaling": "scaled logits",
    "residual_multiplier": "scaled residuals", "attention_multiplier": "a custom attention scale",
}


def bnb_nf4(q, where: str) -> bool:
    """A quantization_config of transformers' bitsandbytes 4-bit NF4 with double quantization, the
    one Horizon reads (True); another bitsandbytes setting is refused naming it; another method
    is False (refused as a quantized checkpoint)."""
    if not isinstance(q, dict) or q.get("quant_method") != "bitsandbytes":
        return False
    want = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
            "bnb_4bit_quant_storage": "uint8"}
    for k, v in want.items():
        if q.get(k, v) != v:
            raise HorizonError(f"{where}: quantization_config {k} = {json.dumps(q.get(k))}; Horizon reads bitsandbytes' "
                               f"4-bit NF4 with double quantization ({k} = {json.dumps(v)}), or full-precision weights")
    return True


def mxfp4_experts(q, mt: str, where: str) -> bool:
    """A quantization_config of gpt-oss's MXFP4 experts (quant_method mxfp4: how the hub's gpt-oss
    checkpoints ship), which Horizon dequantizes on load (True); mxfp4 on another model type is
    refused naming it; another method is False."""
    if not isinstance(q, dict) or q.get("quant_method") != "mxfp4":
        return False
    if mt != "gpt_oss":
        raise HorizonError(f"{where}: quantization_config quant_method \"mxfp4\" on a {mt} model; Horizon reads MXFP4 "
                           "experts in gpt_oss checkpoints only")
    extra = sorted(set(q) - {"quant_method", "modules_to_not_convert", "dequantize"})
    if extra:
        raise HorizonError(f"{where}: quantization_config {extra[0]!r} is not an MXFP4 setting Horizon reads "
                           "(quant_method, modules_to_not_convert, dequantize)")
    return True


def fp8_blocks(q, where: str) -> bool:
    """A quantization_config of block-wise FP8 weights (quant_method fp8, e4m3, dynamic activations:
    DeepSeek-V3's hub checkpoint), which Horizon dequantizes on load (True); another FP8 setting is
    refused naming it; another method is False."""
    if not isinstance(q, dict) or q.get("quant_method") != "fp8":
        return False
    for k, want in (("fmt", "e4m3"), ("activation_scheme", "dynamic")):
        if q.get(k, want) != want:
            raise HorizonError(f"{where}: quantization_config {k} = {json.dumps(q.get(k))}; Horizon reads block-wise "
                               f"FP8 with {k} = {json.dumps(want)}")
    b = q.get("weight_block_size", [128, 128])
    if not (isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                        for x in b)):
        raise HorizonError(f"{where}: quantization_config weight_block_size = {json.dumps(b)}; want two positive "
                           "integers (rows, columns), e.g. [128, 128]")
    extra = sorted(set(q) - {"quant_method", "fmt", "activation_scheme", "weight_block_size", "modules_to_not_convert",
                             "dequantize"})
    if extra:
        raise HorizonError(f"{where}: quantization_config {extra[0]!r} is not an FP8 setting Horizon reads")
    return True


def _padding_idx(cfg: dict, where: str, given: bool, mt: str) -> int | None:
    """pad_token_id: the embedding row transformers never trains (nn.Embedding's padding_idx),
    which must be a row of the vocabulary (transformers refuses to build the model otherwise).
    given: the file set it (else it is the class's default, which the error says)."""
    pad = cfg.get("pad_token_id")
    if pad is None:
        return None
    vocab = as_int(cfg, "vocab_size", where)
    pad = as_int(cfg, "pad_token_id", where, minimum=0)
    if pad >= vocab:
        whose = "" if given else f" ({mt}'s default: the file does not set it)"
        raise HorizonError(f"{where}: pad_token_id = {pad}{whose} is not a row of the {vocab}-token embedding "
                           "(transformers cannot build this model); want 0..vocab_size-1 or null")
    return pad


def _config_file(path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise HorizonError(f"model config {str(p)!r} not found; give a config.json or a directory holding one")
    return p


def _norm_eps(v, where: str) -> float:
    """rms_norm_eps in (0, MAX_NORM_EPS] (model.py says why), named as the config names it."""
    eps = as_float(v, "rms_norm_eps", where)
    if eps > MAX_NORM_EPS:
        raise HorizonError(f"{where}: key 'rms_norm_eps' = {v!r} must lie in (0, {MAX_NORM_EPS:g}] (it is added to "
                           f"the activations' mean square; usual values 1e-6 .. 1e-5)")
    return eps


def _check_fields(cfg: dict, mt: str, where: str) -> None:
    """Every key is read, ignored on purpose, or refused by name."""
    known = READ | READ_BY_TYPE[mt] | IGNORED
    for key, v in cfg.items():
        if key in known:
            continue
        if key in _FOREIGN:
            if v is None or v is False or v == {} or (key == "partial_rotary_factor" and v == 1):
                continue  # present at its off value
            if key == "quantization_config" and (bnb_nf4(v, where) or mxfp4_experts(v, mt, where)
                                                 or fp8_blocks(v, where)):
                continue  # the weights are stored 4-bit; the model is the same (horizon_exec/checkpoints/hf_bnb.py)
            hint = (f"; transformers runs its own {mt} class unless trust_remote_code: delete auto_map to train "
                    "that class") if key == "auto_map" else ""
            raise HorizonError(f"{where}: {key} = {json.dumps(v)[:60]} is {_FOREIGN[key]}, which Horizon "
                               f"does not implement{hint}")
        if any(key in fields for t, fields in READ_BY_TYPE.items() if t != mt):
            raise HorizonError(f"{where}: {key!r} is not a {mt} config field ({mt} models have no such "
                               f"feature in transformers); remove it or fix model_type")
        raise HorizonError(f"{where}: unknown config field {key!r} for model_type {mt!r}; Horizon reads or "
                           f"deliberately ignores every field it trains by, and does not know this one "
                           f"(remove it if it is metadata)")
    if (d := cfg.get("attention_dropout")) not in (None, 0, 0.0):
        raise HorizonError(f"{where}: attention_dropout = {d!r}; Horizon trains without dropout (want 0)")


# ---- RoPE -----------------------------------------------------------------------------------
_ROPE_KEYS = {  # keys transformers' validators accept per rope type (+ rope_type/type, rope_theta)
    "default": set(), "linear": {"factor"}, "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
    "longrope": {"factor", "original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"},
}


def _rope(cfg: dict, where: str, partial: bool = False) -> tuple[float, RopeScaling | None, float]:
    """(rope_theta, scaling, rotary fraction) as transformers 5 standardizes them: `rope_scaling`
    (4.x) wins over `rope_parameters` when set; rope_theta and partial_rotary_factor inside the
    dict win over the top-level ones. partial: the class rotates part of each head (else a
    factor other than 1 is refused)."""
    params, key = None, None
    for k in ("rope_scaling", "rope_parameters"):
        if cfg.get(k):
            params, key = cfg[k], k
            break
    if params is not None and not isinstance(params, dict):
        raise HorizonError(f"{where}: key {key!r} = {params!r} must be an object")
    params = dict(params or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        raise HorizonError(f"{where}: {key} per layer type ({', '.join(map(repr, params))}) is not supported")
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = cfg.get("rope_theta")
    theta = _DEFAULT_ROPE_THETA if theta is None else as_float(theta, "rope_theta", where)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in _ROPE_KEYS:
        raise HorizonError(f"{where}: {key} rope type {kind!r} is not supported; allowed: default, "
                           f"{', '.join(ROPE_KINDS)}")
    prf = params.pop("partial_rotary_factor", None)
    if prf is not None and prf != 1 and not partial:
        raise HorizonError(f"{where}: {key}.partial_rotary_factor = {prf!r}: partial rotary embeddings "
                           "are not supported")
    extra = sorted(set(params) - _ROPE_KEYS[kind])
    if extra:
        raise HorizonError(f"{where}: {key}: {extra[0]!r} is not a parameter of rope type {kind!r} "
                           f"(allowed: {', '.join(sorted(_ROPE_KEYS[kind])) or 'none'})")
    if prf is None:
        prf = cfg.get("partial_rotary_factor", 1.0) if partial else 1.0
    prf = as_float(prf, "partial_rotary_factor", where)
    if kind == "default":
        return theta, None, prf
    if kind not in ("yarn", "longrope") and params.get("factor") is None:
        raise HorizonError(f"{where}: {key} rope type {kind!r} needs a 'factor'")
    num = {}
    for k, field in (("factor", "factor"), ("low_freq_factor", "low_freq_factor"),
                     ("high_freq_factor", "high_freq_factor"), ("beta_fast", "beta_fast"),
                     ("beta_slow", "beta_slow"), ("attention_factor", "attention_factor"),
                     ("mscale", "mscale"), ("mscale_all_dim", "mscale_all_dim")):
        if params.get(k) is not None:
            num[field] = as_float(params[k], f"{key}.{k}", where, strict=False)
    if num.get("factor", 1.0) < 1.0:  # yarn's null factor is derived; an explicit one below 1 is invalid
        raise HorizonError(f"{where}: {key}.factor = {params['factor']!r} must be >= 1 (a context stretch)")
    if num.get("attention_factor", 1.0) <= 0.0:
        raise HorizonError(f"{where}: {key}.attention_factor = {params['attention_factor']!r} must be > 0 "
                           "(or absent: derived from factor)")
    for k, dflt in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        if num.get(k) == 0.0:  # transformers' `beta_fast or 32`, `beta_slow or 1`
            num[k] = dflt
    if params.get("original_max_position_embeddings") is not None:
        num["original_max_position"] = as_int(params, "original_max_position_embeddings", f"{where}: {key}")
    if kind == "longrope":
        if cfg.get("original_max_position_embeddings") is not None:  # Phi-3's top-level one wins (transformers)
            num["original_max_position"] = as_int(cfg, "original_max_position_embeddings", where)
        for k in ("short_factor", "long_factor"):
            v = params.get(k)
            if not isinstance(v, list) or not v:
                raise HorizonError(f"{where}: {key}.{k} = {v!r} must be a list of numbers (one per rotated "
                                   "frequency)")
            num[k] = tuple(as_float(x, f"{key}.{k}", where, strict=False) for x in v)
    if "truncate" in params:
        num["truncate"] = as_bool(params, "truncate", f"{where}: {key}", True)
    try:
        return theta, RopeScaling(kind=kind, **num), prf
    except HorizonError as e:
        raise HorizonError(f"{where}: {e}") from None


def _resolve(s: RopeScaling | None, max_position: int) -> RopeScaling | None:
    """Fill in what transformers derives from max_position_embeddings: the pretraining context
    of llama3/yarn (standardize_rope_params' setdefault) and yarn's null factor."""
    if s is None or s.kind in ("linear",):
        return s
    if s.kind == "dynamic" and not max_position:
        raise HorizonError("rope type 'dynamic' needs max_position_embeddings")
    if s.kind in ("llama3", "yarn", "longrope") and not s.original_max_position:
        if not max_position:
            raise HorizonError(f"rope type {s.kind!r} needs original_max_position_embeddings or "
                               "max_position_embeddings")
        s = replace(s, original_max_position=max_position)
    if s.kind == "yarn" and not s.factor:
        if not max_position:
            raise HorizonError("rope type 'yarn' with factor null needs max_position_embeddings")
        s = replace(s, factor=max_position / s.original_max_position)
    return s


def from_hf_config(path) -> ModelSpec:
    """ModelSpec from a local HF config.json (`path` is the file or a directory holding it)."""
    file = _config_file(path)
    where = str(file)
    cfg = read_json(file, where)  # every parse failure one line (safe_read.py)
    if not isinstance(cfg, dict):
        raise HorizonError(f"{where}: top level must be a JSON object, got {type(cfg).__name__}")
    return spec_from_config_dict(cfg, where, file)


def spec_from_config_dict(cfg: dict, where: str = "config.json", file: Path | None = None) -> ModelSpec:
    """ModelSpec from a config dict (`where` names it in errors)."""
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in WRAPPED_TYPES:
        return _wrapped_language_model(cfg, mt, where, file)
    if isinstance(mt, str) and mt in hf_moe.REFUSED_TYPES:  # a list or dict is not a key: refused below
        raise HorizonError(f"{where}: model_type {mt!r} is {hf_moe.REFUSED_TYPES[mt]}, which Horizon does not "
                           f"implement; MoE types supported: {', '.join(_MOE_TYPES)}")
    if isinstance(mt, str) and mt in REFUSED_DENSE:
        raise HorizonError(f"{where}: model_type {mt!r} is {REFUSED_DENSE[mt]}, which Horizon does not implement yet; "
                           f"allowed: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise HorizonError(f"{where}: model_type {mt!r} is not supported; allowed: "
                           f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    _check_fields(cfg, mt, where)
    row = HF_ROWS[mt]
    pad_given = "pad_token_id" in cfg
    cfg = row.prepare(with_hf_defaults({row.aliases.get(k, k): v for k, v in cfg.items()}, mt))
    act = cfg.get("hidden_act", "silu")
    if act not in row.activations:
        raise HorizonError(f"{where}: {row.own_key('hidden_act')} {act!r} is not supported; {mt} takes "
                           f"{', '.join(row.activations)}")

    heads = as_int(cfg, "num_attention_heads", where)
    hidden = as_int(cfg, "hidden_size", where)
    head_dim = as_int(cfg, "head_dim", where) if cfg.get("head_dim") is not None else 0
    if head_dim and hidden % heads == 0 and head_dim == hidden // heads:
        head_dim = 0

    n_layers = as_int(cfg, "num_hidden_layers", where)
    theta, scaling, fraction = _rope(cfg, where, row.partial_rotary)

    eps = cfg.get("rms_norm_eps")
    name = cfg.get("_name_or_path") or (
        (file.parent.name if file.name == "config.json" else file.stem) if file is not None else "")
    fields = dict(
        name=str(name) or "custom",
        n_layers=n_layers,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=as_int(cfg, "num_key_value_heads", where, default=heads),
        head_dim=head_dim,
        ffn_hidden=as_int(cfg, "intermediate_size", where),
        vocab=as_int(cfg, "vocab_size", where),
        tied_embeddings=as_bool(cfg, "tie_word_embeddings", where, False),
        family=mt,  # every config class Horizon reads is the family of its name
        norm_eps=_norm_eps(eps, where),
        rope_theta=theta,
        rope_scaling=scaling,
        rotary_fraction=fraction,
        max_position=as_int(cfg, "max_position_embeddings", where, default=0, minimum=0),
        layer_windows=(),
        init_std=as_float(cfg["initializer_range"], "initializer_range", where, strict=False),
        padding_idx=_padding_idx(cfg, where, pad_given, mt),
        hidden_act="" if act == row.activations[0] else act,
    )
    fields.update(row.read(cfg, where, n_layers))
    try:
        fields["rope_scaling"] = _resolve(scaling, fields["max_position"])
        return ModelSpec(**fields)
    except HorizonError as e:  # ModelSpec's own consistency checks (e.g. heads vs kv heads)
        raise HorizonError(f"{where}: {e}") from None


def _wrapped_language_model(cfg: dict, mt: str, where: str, file: Path | None) -> ModelSpec:
    """A multimodal config's language model: its text_config read as its own model type, named
    and tied as the whole model is (the multimodal class ties its head by the top-level field)."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise HorizonError(f"{where}: model_type {mt!r} needs a text_config (its language model's config), "
                           f"got {json.dumps(text)[:60]}")
    inner = {**text, "model_type": WRAPPED_TYPES[mt]}
    for key in ("_name_or_path", "tie_word_embeddings"):
        if key in cfg:
            inner[key] = cfg[key]
    return spec_from_config_dict(inner, f"{where} text_config", file)


def model_source(name_or_path) -> Path | None:
    """The config.json a --model value names: a path, or a model id ('Qwen/Qwen2.5-7B') in the
    local Hugging Face cache; None for a preset name."""
    s = os.fspath(name_or_path)
    if s.endswith(".json") or os.path.exists(s):
        return _config_file(s)
    if looks_like_model_id(s):
        return resolve_model_dir(s) / "config.json"
    return None


def load_model(name_or_path) -> ModelSpec:
    """A preset name ('llama-2-7b'), a path to a config.json / a directory holding one, or a
    model id in the local Hugging Face cache."""
    src = model_source(name_or_path)
    return from_hf_config(src) if src is not None else model_preset(os.fspath(name_or_path))
