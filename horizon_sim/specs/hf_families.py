"""The transformers model classes Horizon maps, one row (HfFamily) each: the class's config
defaults, the fields it reads beyond the shared ones, how they become ModelSpec fields, and the
way back. hf_config.py (the generic reader), hf_defaults.py (the absent-key filler) and
hf_export.py (the generic writer) hold nothing per family: a new family is a new row here.

Per family (HF name -> ModelSpec field; the shared fields: hf_config.py):

    llama      mlp_bias -> mlp_bias; attention_bias true (a bias on o too) is refused
    qwen2      qkv_bias = True (q/k/v biases, never o/MLP ones); use_sliding_window,
               sliding_window, max_window_layers, layer_types -> layer_windows; use_mrope refused
    mistral    sliding_window -> layer_windows (one window on every layer; null: none)
    qwen3      qk_norm = True (per-head q/k RMSNorms; head_dim defaults to 128); windows as qwen2;
               attention_bias true refused
    qwen3_moe  qk_norm = True and the MoE fields (hf_moe.py); attention_bias true refused
    mixtral    the MoE fields, intermediate_size -> expert_ffn_hidden, norm_topk_prob always;
               a sliding window and router_jitter_noise other than 0 refused
    qwen2_moe  qkv_bias (a field, default true), the MoE fields and the shared expert

The writer asks each dense row's `claims` which class expresses a spec (exactly one does; an
MoE spec names its row in moe_family), then writes the shared keys and the row's `export`.
"""
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from horizon_sim.errors import HorizonError
from horizon_sim.specs import hf_moe
from horizon_sim.specs.hf_values import as_bool, as_float, as_int
from horizon_sim.specs.model import ModelSpec


@dataclass(frozen=True)
class HfFamily:
    """One transformers model class (its config.json model_type)."""
    model_type: str
    architecture: str
    """The *ForCausalLM class config.json's `architectures` names."""
    defaults: Mapping[str, object]
    """Its config class's keyword defaults (transformers 5): what an absent key means.
    tests/test_hf_config_defaults.py holds them against the installed class."""
    reads: frozenset[str]
    """Config fields it reads or checks beyond hf_config.READ (a field another row reads is
    refused in this one by name)."""
    read: Callable[[dict, str, int], dict]
    """(config with the defaults filled in, where, n_layers) -> its ModelSpec fields (and its
    one-line refusals)."""
    export: Callable[[ModelSpec], dict]
    """spec -> its own config keys (raises when the class cannot express spec)."""
    claims: Callable[[ModelSpec], bool] | None = None
    """Dense rows: whether this class writes spec (exactly one dense row claims each dense
    spec). None for an MoE row, which spec.moe_family names."""

    @property
    def moe(self) -> bool:
        return self.claims is None


_COMMON = {
    "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_theta": 10000.0, "attention_dropout": 0.0,
}
_QWEN_WINDOWS = {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}
_WINDOW_FIELDS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})


def _defaults(**kv) -> Mapping[str, object]:
    return MappingProxyType({**_COMMON, **kv})


def _refuse_attention_bias(cfg: dict, mt: str, where: str) -> None:
    if as_bool(cfg, "attention_bias", where, False):
        raise HorizonError(f"{where}: {mt} attention_bias=true (bias on q, k, v and o) is not "
                           "supported; only qwen2-style q/k/v biases are")


# ---- sliding windows ------------------------------------------------------------------------
def _one_window(cfg: dict, where: str, n_layers: int) -> tuple[int, ...]:
    """MistralAttention: sliding_window on every layer (null: full attention)."""
    w = cfg.get("sliding_window")
    return (as_int(cfg, "sliding_window", where),) * n_layers if w is not None else ()


def _windows_by_layer(cfg: dict, where: str, n_layers: int) -> tuple[int, ...]:
    """Qwen2Attention (Qwen3's the same): the window on the layers layer_types (or, without
    it, max_window_layers) marks sliding, only when use_sliding_window."""
    if not as_bool(cfg, "use_sliding_window", where, False):
        return ()  # Qwen2Config drops sliding_window unless use_sliding_window
    if "sliding_window" in cfg and cfg["sliding_window"] is None:
        return ()
    w = as_int(cfg, "sliding_window", where, default=_QWEN_WINDOWS["sliding_window"])
    types = cfg.get("layer_types")
    if types is None:
        first = as_int(cfg, "max_window_layers", where, default=_QWEN_WINDOWS["max_window_layers"], minimum=0)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    if (not isinstance(types, list) or len(types) != n_layers
            or any(t not in ("full_attention", "sliding_attention") for t in types)):
        raise HorizonError(f"{where}: layer_types must list 'full_attention' or 'sliding_attention' "
                           f"for each of the {n_layers} layers")
    wins = tuple(w if t == "sliding_attention" else 0 for t in types)
    return wins if any(wins) else ()


def _export_windows_by_layer(spec: ModelSpec) -> dict:
    if not spec.layer_windows:
        return {"use_sliding_window": False}
    w = max(spec.layer_windows)
    if any(x not in (0, w) for x in spec.layer_windows):
        raise HorizonError(f"model {spec.name!r}: qwen2 has one sliding window size, the layers "
                           f"want {sorted(set(spec.layer_windows))}")
    return dict(use_sliding_window=True, sliding_window=w,
                layer_types=["sliding_attention" if x else "full_attention" for x in spec.layer_windows])


# ---- dense rows -----------------------------------------------------------------------------
def _read_llama(cfg: dict, where: str, n_layers: int) -> dict:
    _refuse_attention_bias(cfg, "llama", where)
    return dict(mlp_bias=as_bool(cfg, "mlp_bias", where, False))


def _read_qwen2(cfg: dict, where: str, n_layers: int) -> dict:
    if cfg.get("use_mrope"):
        raise HorizonError(f"{where}: use_mrope = true (multimodal RoPE) is not supported")
    return dict(qkv_bias=True, layer_windows=_windows_by_layer(cfg, where, n_layers))


def _export_qwen2(spec: ModelSpec) -> dict:
    if spec.mlp_bias:
        raise HorizonError(f"model {spec.name!r} has q/k/v and MLP biases; no transformers class "
                           "has exactly that (llama attention_bias also adds an o bias)")
    return _export_windows_by_layer(spec)  # Qwen2 windows any subset of layers (layer_types)


def _read_mistral(cfg: dict, where: str, n_layers: int) -> dict:
    return dict(layer_windows=_one_window(cfg, where, n_layers))


def _export_mistral(spec: ModelSpec) -> dict:
    if spec.mlp_bias or len(set(spec.layer_windows)) != 1:
        raise HorizonError(f"model {spec.name!r}: sliding windows that differ by layer, or with MLP "
                           "biases, have no transformers class without q/k/v biases (qwen2 has them)")
    return {"sliding_window": spec.layer_windows[0]}


def _read_qwen3(cfg: dict, where: str, n_layers: int) -> dict:
    _refuse_attention_bias(cfg, "qwen3", where)
    return dict(qk_norm=True, layer_windows=_windows_by_layer(cfg, where, n_layers))


def _export_qwen3(spec: ModelSpec) -> dict:
    if spec.qkv_bias or spec.mlp_bias:
        raise HorizonError(f"model {spec.name!r}: q/k norms with biases have no transformers class "
                           "(qwen3's attention_bias also adds an o bias)")
    # Qwen3Config's head_dim default is 128, not hidden // heads: always written
    return {"head_dim": spec.hd, "attention_bias": False, **_export_windows_by_layer(spec)}


# ---- MoE rows (the routing they share: hf_moe.py) -------------------------------------------
_QWEN_MOE_FIELDS = frozenset({"decoder_sparse_step", "moe_intermediate_size", "num_experts",
                              "num_experts_per_tok", "norm_topk_prob", "output_router_logits",
                              "router_aux_loss_coef", "mlp_only_layers"})


def _read_qwen_experts(cfg: dict, where: str) -> dict:
    return dict(expert_ffn_hidden=as_int(cfg, "moe_intermediate_size", where),
                norm_topk_prob=as_bool(cfg, "norm_topk_prob", where, False))


def _export_qwen_experts(spec: ModelSpec) -> dict:
    return {**hf_moe.export(spec, "num_experts"), "moe_intermediate_size": spec.expert_ffn_hidden,
            "norm_topk_prob": spec.norm_topk_prob, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "use_sliding_window": False}


def _read_qwen3_moe(cfg: dict, where: str, n_layers: int) -> dict:
    _refuse_attention_bias(cfg, "qwen3_moe", where)
    routing = hf_moe.read(cfg, "qwen3_moe", where, experts_key="num_experts", aliased=True)
    return dict(**routing, **_read_qwen_experts(cfg, where), qk_norm=True)


def _read_mixtral(cfg: dict, where: str, n_layers: int) -> dict:
    if cfg.get("sliding_window"):
        hf_moe.refuse_window("mixtral", where)
    if as_float(cfg.get("router_jitter_noise", 0.0), "router_jitter_noise", where, strict=False) != 0.0:
        raise HorizonError(f"{where}: router_jitter_noise = {cfg['router_jitter_noise']!r}: router input noise "
                           "in training is not supported (want 0)")
    routing = hf_moe.read(cfg, "mixtral", where, experts_key="num_local_experts", aliased=True)
    return dict(**routing, expert_ffn_hidden=as_int(cfg, "intermediate_size", where), norm_topk_prob=True)


def _read_qwen2_moe(cfg: dict, where: str, n_layers: int) -> dict:
    routing = hf_moe.read(cfg, "qwen2_moe", where, experts_key="num_experts", aliased=False)
    return dict(**routing, **_read_qwen_experts(cfg, where),
                shared_expert_ffn_hidden=as_int(cfg, "shared_expert_intermediate_size", where),
                qkv_bias=as_bool(cfg, "qkv_bias", where, True))


_MOE_DEFAULTS = {"output_router_logits": False, "router_aux_loss_coef": 0.001}
_ROWS = (
    HfFamily(
        "llama", "LlamaForCausalLM",
        _defaults(intermediate_size=11008, num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
                  attention_bias=False, mlp_bias=False),
        frozenset({"attention_bias", "mlp_bias"}), _read_llama,
        lambda s: {"attention_bias": False, "mlp_bias": s.mlp_bias},
        claims=lambda s: not (s.moe_family or s.qk_norm or s.qkv_bias or s.layer_windows)),
    HfFamily(
        "qwen2", "Qwen2ForCausalLM",
        _defaults(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, max_position_embeddings=32768,
                  **_QWEN_WINDOWS),
        _WINDOW_FIELDS | {"use_mrope"}, _read_qwen2, _export_qwen2,
        claims=lambda s: not (s.moe_family or s.qk_norm) and s.qkv_bias),
    HfFamily(
        "mistral", "MistralForCausalLM",
        _defaults(intermediate_size=14336, num_key_value_heads=8, head_dim=None, max_position_embeddings=131072,
                  sliding_window=4096),
        frozenset({"sliding_window"}), _read_mistral, _export_mistral,
        claims=lambda s: not (s.moe_family or s.qk_norm or s.qkv_bias) and bool(s.layer_windows)),
    HfFamily(
        "qwen3", "Qwen3ForCausalLM",
        _defaults(vocab_size=151936, intermediate_size=22016, num_key_value_heads=32, head_dim=128,
                  max_position_embeddings=32768, attention_bias=False, **_QWEN_WINDOWS),
        _WINDOW_FIELDS | {"attention_bias"}, _read_qwen3, _export_qwen3,
        claims=lambda s: not s.moe_family and s.qk_norm),
    HfFamily(
        "qwen3_moe", "Qwen3MoeForCausalLM",
        _defaults(vocab_size=151936, hidden_size=2048, num_hidden_layers=24, intermediate_size=6144,
                  num_key_value_heads=4, max_position_embeddings=32768, attention_bias=False, use_sliding_window=False,
                  sliding_window=4096, decoder_sparse_step=1, moe_intermediate_size=768, num_experts_per_tok=8,
                  num_experts=128, norm_topk_prob=False, mlp_only_layers=None, **_MOE_DEFAULTS),
        _QWEN_MOE_FIELDS | {"num_local_experts", "attention_bias", "use_sliding_window", "sliding_window",
                            "max_window_layers"},
        _read_qwen3_moe, lambda s: {**_export_qwen_experts(s), "attention_bias": False}),
    HfFamily(
        "mixtral", "MixtralForCausalLM",
        _defaults(intermediate_size=14336, num_key_value_heads=8, head_dim=None, max_position_embeddings=131072,
                  rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None, num_experts_per_tok=2, num_local_experts=8,
                  router_jitter_noise=0.0, **_MOE_DEFAULTS),
        frozenset({"num_experts", "sliding_window", "num_local_experts", "num_experts_per_tok",
                   "output_router_logits", "router_aux_loss_coef", "router_jitter_noise"}),
        _read_mixtral,
        lambda s: {**hf_moe.export(s, "num_local_experts"), "router_jitter_noise": 0.0, "sliding_window": None}),
    HfFamily(
        "qwen2_moe", "Qwen2MoeForCausalLM",
        _defaults(vocab_size=151936, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=5632, num_key_value_heads=16, max_position_embeddings=32768, **_QWEN_WINDOWS,
                  decoder_sparse_step=1, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                  num_experts_per_tok=4, num_experts=60, norm_topk_prob=False, mlp_only_layers=None,
                  qkv_bias=True, **_MOE_DEFAULTS),
        _QWEN_MOE_FIELDS | _WINDOW_FIELDS | {"shared_expert_intermediate_size", "qkv_bias"},
        _read_qwen2_moe,
        lambda s: {**_export_qwen_experts(s), "shared_expert_intermediate_size": s.shared_expert_ffn_hidden,
                   "qkv_bias": s.qkv_bias}),
)
FAMILIES: Mapping[str, HfFamily] = MappingProxyType({f.model_type: f for f in _ROWS})
"""{model_type: its row}, in the order errors list them."""


def family_of(spec: ModelSpec) -> HfFamily:
    """The row whose class expresses spec (its export may still refuse spec by name)."""
    if spec.moe_family:
        return FAMILIES[spec.moe_family]  # ModelSpec checked the block is that family's (specs/moe.py)
    (row,) = [f for f in _ROWS if f.claims is not None and f.claims(spec)]
    return row
