"""What every family's transformers config row is made of (HfFamily), and the pieces the rows
share: the config classes' common defaults, the sliding-window fields of Qwen2/Qwen3 and
Mistral, and the Qwen MoE experts' fields. Each family's own row (its class, defaults, the fields
it reads and how, and the way back) lives in its module, horizon_sim/specs/families/<name>.py;
hf_config.py (the generic reader), hf_defaults.py (the absent-key filler) and hf_export.py (the
generic writer) hold nothing per family.
"""
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from horizon_sim.errors import HorizonError
from horizon_sim.specs import hf_moe
from horizon_sim.specs.hf_values import as_bool, as_float, as_int


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
    export: Callable[[object], dict]
    """spec -> its own config keys (raises when the class cannot express spec)."""
    aliases: Mapping[str, str] = field(default_factory=dict)
    """{its config key: the shared name hf_config reads} for a class that names the shared
    fields its own way (GPT-2's n_embd for hidden_size); the writer renames them back."""
    activations: tuple[str, ...] = ("silu", "swish")
    """hidden_act values it accepts (transformers maps silu and swish both to SiLU)."""
    prepare: Callable[[dict], dict] = lambda cfg: cfg
    """The config after aliasing and defaults -> the config the shared reader reads (e.g. an
    intermediate_size null meaning 4 x hidden)."""
    drops: frozenset[str] = frozenset()
    """Shared keys the writer leaves out: fields its class does not have."""
    partial_rotary: bool = False
    """Its class rotates part of each head (partial_rotary_factor, read into rotary_fraction
    and written back); elsewhere a factor other than 1 is refused by name."""

    def own_key(self, shared: str) -> str:
        """Its class's name for a shared field (GPT-2's n_embd for hidden_size)."""
        return next((own for own, s in self.aliases.items() if s == shared), shared)


_COMMON = {
    "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_theta": 10000.0, "attention_dropout": 0.0, "pad_token_id": None,
}
QWEN_WINDOWS = {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}
WINDOW_FIELDS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})


def defaults_with(**kv) -> Mapping[str, object]:
    return MappingProxyType({**_COMMON, **kv})


def refuse_attention_bias(cfg: dict, mt: str, where: str) -> None:
    if as_bool(cfg, "attention_bias", where, False):
        raise HorizonError(f"{where}: {mt} attention_bias=true (bias on q, k, v and o) is not "
                           "supported; only qwen2-style q/k/v biases are")


# ---- sliding windows ------------------------------------------------------------------------
def one_window(cfg: dict, where: str, n_layers: int) -> tuple[int, ...]:
    """MistralAttention: sliding_window on every layer (null: full attention)."""
    w = cfg.get("sliding_window")
    return (as_int(cfg, "sliding_window", where),) * n_layers if w is not None else ()


def windows_by_layer(cfg: dict, where: str, n_layers: int) -> tuple[int, ...]:
    """Qwen2Attention (Qwen3's the same): the window on the layers layer_types (or, without
    it, max_window_layers) marks sliding, only when use_sliding_window."""
    if not as_bool(cfg, "use_sliding_window", where, False):
        return ()  # Qwen2Config drops sliding_window unless use_sliding_window
    if "sliding_window" in cfg and cfg["sliding_window"] is None:
        return ()
    w = as_int(cfg, "sliding_window", where, default=QWEN_WINDOWS["sliding_window"])
    types = cfg.get("layer_types")
    if types is None:
        first = as_int(cfg, "max_window_layers", where, default=QWEN_WINDOWS["max_window_layers"], minimum=0)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    return windows_of_types(types, w, where, n_layers)


def windows_of_types(types, window: int, where: str, n_layers: int) -> tuple[int, ...]:
    """layer_types (each layer 'full_attention' or 'sliding_attention') -> layer_windows: the
    window on the sliding layers, () when none slides."""
    if (not isinstance(types, list) or len(types) != n_layers
            or any(t not in ("full_attention", "sliding_attention") for t in types)):
        raise HorizonError(f"{where}: layer_types must list 'full_attention' or 'sliding_attention' "
                           f"for each of the {n_layers} layers")
    wins = tuple(window if t == "sliding_attention" else 0 for t in types)
    return wins if any(wins) else ()


def one_window_size(spec, mt: str) -> int:
    """The one sliding window of spec's sliding layers (0: none); a class with one window size
    (mt) refuses layers that want several."""
    w = max(spec.layer_windows, default=0)
    if any(x not in (0, w) for x in spec.layer_windows):
        raise HorizonError(f"model {spec.name!r}: {mt} has one sliding window size, the layers "
                           f"want {sorted(set(spec.layer_windows))}")
    return w


def layer_types(spec) -> list[str]:
    """spec's layer_windows as transformers' layer_types."""
    return ["sliding_attention" if spec.window(i) else "full_attention" for i in range(spec.n_layers)]


def export_windows_by_layer(spec) -> dict:
    if not spec.layer_windows:
        return {"use_sliding_window": False}
    return dict(use_sliding_window=True, sliding_window=one_window_size(spec, "qwen2"), layer_types=layer_types(spec))


# ---- MoE rows (the routing they share: hf_moe.py) -------------------------------------------
QWEN_MOE_FIELDS = frozenset({"decoder_sparse_step", "moe_intermediate_size", "num_experts",
                              "num_experts_per_tok", "norm_topk_prob", "output_router_logits",
                              "router_aux_loss_coef", "mlp_only_layers"})


def read_qwen_experts(cfg: dict, where: str) -> dict:
    return dict(expert_ffn_hidden=as_int(cfg, "moe_intermediate_size", where),
                norm_topk_prob=as_bool(cfg, "norm_topk_prob", where, False))


def export_qwen_experts(spec) -> dict:
    return {**hf_moe.export(spec, "num_experts"), "moe_intermediate_size": spec.expert_ffn_hidden,
            "norm_topk_prob": spec.norm_topk_prob, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "use_sliding_window": False}


MOE_DEFAULTS = {"output_router_logits": False, "router_aux_loss_coef": 0.001}
