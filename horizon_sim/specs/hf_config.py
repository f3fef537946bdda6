"""Read a local Hugging Face `config.json` into a ModelSpec (no transformers import, no network).

Supported model_type: llama, qwen2, mistral. Field mapping (HF name -> ModelSpec field):

    num_hidden_layers   -> n_layers          (required)
    hidden_size         -> hidden            (required)
    num_attention_heads -> n_heads           (required)
    num_key_value_heads -> n_kv_heads        (default: num_attention_heads)
    head_dim            -> head_dim          (0 when absent/null or equal to hidden // heads)
    intermediate_size   -> ffn_hidden        (required; always a gated SiLU MLP)
    vocab_size          -> vocab             (required)
    tie_word_embeddings -> tied_embeddings   (default False, as in all three HF classes)
    qwen2               -> qkv_bias = True   (Qwen2 always has q/k/v biases, never o/MLP biases)
    mlp_bias            -> mlp_bias          (llama only)
    rms_norm_eps        -> norm_eps          (default 1e-6, as in all three HF classes)
    rope_theta or rope_parameters["rope_theta"] (or rope_scaling["rope_theta"]) -> rope_theta

Llama's `attention_bias: true` puts a bias on q, k, v *and* o; ModelSpec's qkv_bias covers
q, k, v only, so such configs are refused rather than miscounted. Sliding-window attention
(Mistral v0.1, Qwen2 use_sliding_window) does not change parameter counts and is ignored.
"""
import json
import os
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import model_preset

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
_SILU = ("silu", "swish")  # transformers maps both names to SiLU
_DEFAULT_ROPE_THETA = 10000.0  # default_theta of all three HF config classes
_DEFAULT_RMS_EPS = 1e-6  # rms_norm_eps default of all three HF config classes


def _config_file(path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise HorizonError(f"model config {str(p)!r} not found; give a config.json or a directory holding one")
    return p


def _int(cfg: dict, key: str, where: str, default=None) -> int:
    if key not in cfg or (cfg[key] is None and default is not None):
        if default is None:
            raise HorizonError(f"{where}: required key {key!r} is missing")
        return default
    v = cfg[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise HorizonError(f"{where}: key {key!r} = {v!r} must be an integer")
    if v <= 0:
        raise HorizonError(f"{where}: key {key!r} = {v!r} must be a positive integer")
    return v


def _bool(cfg: dict, key: str, where: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise HorizonError(f"{where}: key {key!r} = {v!r} must be true or false")
    return v


def _float(v, key: str, where: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
        raise HorizonError(f"{where}: key {key!r} = {v!r} must be a positive number")
    return float(v)


def _rope_theta(cfg: dict, where: str) -> float:
    """rope_theta sits top-level in older configs and inside rope_parameters (transformers >= 5)
    or, in a few exports, rope_scaling."""
    if cfg.get("rope_theta") is not None:
        return _float(cfg["rope_theta"], "rope_theta", where)
    for key in ("rope_parameters", "rope_scaling"):
        sub = cfg.get(key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise HorizonError(f"{where}: key {key!r} = {sub!r} must be an object")
        if sub.get("rope_theta") is not None:
            return _float(sub["rope_theta"], f"{key}.rope_theta", where)
    return _DEFAULT_ROPE_THETA


def from_hf_config(path) -> ModelSpec:
    """ModelSpec from a local HF config.json (`path` is the file or a directory holding it)."""
    file = _config_file(path)
    where = str(file)
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise HorizonError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HorizonError(f"{where}: cannot read ({e.__class__.__name__}: {e})") from None
    if not isinstance(cfg, dict):
        raise HorizonError(f"{where}: top level must be a JSON object, got {type(cfg).__name__}")

    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise HorizonError(f"{where}: model_type {mt!r} is not supported; allowed: "
                           f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    act = cfg.get("hidden_act", "silu")
    if act not in _SILU:
        raise HorizonError(f"{where}: hidden_act {act!r} is not supported; the gated MLP must use silu")

    heads = _int(cfg, "num_attention_heads", where)
    hidden = _int(cfg, "hidden_size", where)
    head_dim = _int(cfg, "head_dim", where) if cfg.get("head_dim") is not None else 0
    if head_dim and hidden % heads == 0 and head_dim == hidden // heads:
        head_dim = 0

    if mt == "llama" and _bool(cfg, "attention_bias", where, False):
        raise HorizonError(f"{where}: llama attention_bias=true (bias on q, k, v and o) is not "
                           "supported; only qwen2-style q/k/v biases are")
    qkv_bias = mt == "qwen2"
    mlp_bias = _bool(cfg, "mlp_bias", where, False) if mt == "llama" else False

    eps = cfg.get("rms_norm_eps")
    name = cfg.get("_name_or_path") or (file.parent.name if file.name == "config.json" else file.stem)
    fields = dict(
        name=str(name) or "custom",
        n_layers=_int(cfg, "num_hidden_layers", where),
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=_int(cfg, "num_key_value_heads", where, default=heads),
        head_dim=head_dim,
        ffn_hidden=_int(cfg, "intermediate_size", where),
        ffn_type="gated",
        vocab=_int(cfg, "vocab_size", where),
        tied_embeddings=_bool(cfg, "tie_word_embeddings", where, False),
        qkv_bias=qkv_bias,
        mlp_bias=mlp_bias,
        norm="rmsnorm",
        norm_eps=_float(eps, "rms_norm_eps", where) if eps is not None else _DEFAULT_RMS_EPS,
        rope_theta=_rope_theta(cfg, where),
    )
    try:
        return ModelSpec(**fields)
    except HorizonError as e:  # ModelSpec's own consistency checks (e.g. heads vs kv heads)
        raise HorizonError(f"{where}: {e}") from None


def load_model(name_or_path) -> ModelSpec:
    """A preset name ('llama-2-7b') or a path to a config.json / a directory holding one."""
    s = os.fspath(name_or_path)
    if s.endswith(".json") or os.path.exists(s):
        return from_hf_config(s)
    return model_preset(s)
