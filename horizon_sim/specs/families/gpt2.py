"""GPT-2 (GPT2LMHeadModel, model_type gpt2), the shape of most published offload measurements
(Megatron-LM's GPT-2 in the DeepSpeed and ZeRO-Offload tables): LayerNorm with a bias before
attention and before the MLP, q/k/v in one projection and every projection biased, weights stored
(in, out) (transformers' Conv1D), learned absolute positions (transformer.wpe, n_positions rows,
after the token rows in the embedding unit; a step's seq may not exceed them) beside the token
embedding, a plain GELU MLP (4 x hidden unless n_inner; the tanh form, gelu_new, unless the
config names erf's gelu), the head tied to the token embedding. The executor runs it
(horizon_exec/model/families/gpt2.py); dropout is not run (GPT-2's configs keep 0.1: a run says
so, and --save-hf keeps the values).

HF config (its own names, aliased to the shared ones): n_embd, n_layer, n_head, n_inner (null:
4 x n_embd), n_positions, layer_norm_epsilon, activation_function (gelu_new, gelu,
gelu_pytorch_tanh); add_cross_attention true, scale_attn_weights false and
scale_attn_by_inverse_layer_idx true are refused by name (reorder_and_upcast_attn only changes
the precision of a half-precision run's scores); the sequence-summary head's fields (summary_*)
and n_ctx (older configs' copy of n_positions) are not used by the causal LM."""
from types import MappingProxyType

from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import Kernel, Projection, block_tensors
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import HfFamily
from horizon_sim.specs.hf_values import as_bool


def projections(m):
    H, F = m.hidden, m.ffn_hidden
    return (Projection("attn.c_attn", H, 3 * H, True, transposed=True), Projection("attn.c_proj", H, H, True, transposed=True, inner=True),
            Projection("mlp.c_fc", H, F, True, transposed=True), Projection("mlp.c_proj", F, H, True, transposed=True, inner=True))


def kernels(m):
    """LayerNorm of x, q|k|v split (views: nothing copied), attention, the add x1 = x + attention;
    LayerNorm of x1, the GELU, the add y = x1 + MLP. No RoPE: the embedding adds positions."""
    H = m.hidden
    return (Kernel("layernorm", "attention", H, output_saved=True, reads_block_input=True),
            Kernel("split", "attention", 3 * H),
            Kernel("attention", "attention", H, rows=m.n_heads, kv_width=H),
            Kernel("residual", "attention", H),
            Kernel("layernorm", "mlp", H, output_saved=True),
            Kernel("silu", "mlp", m.ffn_hidden),  # the GELU: a plain activation's bytes
            Kernel("residual", "mlp", H))


def tensors(m):
    """ln_1, the attention's projections, ln_2, the MLP's (GPT2Block's order)."""
    ps = projections(m)
    ln = lambda name: ((f"{name}.weight", (m.hidden,)), (f"{name}.bias", (m.hidden,)))  # noqa: E731
    return (*ln("ln_1"), *block_tensors(m, ps[:2], norm_tensors=()),
            *ln("ln_2"), *block_tensors(m, ps[2:], norm_tensors=()))


def _check(m) -> None:
    if m.n_kv_heads != m.n_heads or m.hd * m.n_heads != m.hidden:
        raise HorizonError(f"model {m.name!r}: gpt2 has n_kv_heads = n_heads and head_dim = hidden / n_heads "
                           f"(not {m.n_kv_heads} kv heads of {m.hd})")


def _prepare(cfg: dict) -> dict:
    if cfg.get("intermediate_size") is None and isinstance(cfg.get("hidden_size"), int):
        cfg = {**cfg, "intermediate_size": 4 * cfg["hidden_size"]}  # GPT2MLP: n_inner or 4 * n_embd
    return cfg


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    if as_bool(cfg, "add_cross_attention", where, False):
        raise HorizonError(f"{where}: add_cross_attention = true (an encoder-decoder's cross attention) is not "
                           "supported")
    for field, runs in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if as_bool(cfg, field, where, runs) != runs:
            raise HorizonError(f"{where}: {field} = {str(not runs).lower()} is not supported (attention scores are "
                               "scaled by 1 / sqrt(head_dim) only)")
    return {}  # every projection biased: the spec's qkv_bias and mlp_bias do not apply


HF = HfFamily(
    "gpt2", "GPT2LMHeadModel",
    MappingProxyType(dict(  # GPT2Config's own (no shared ones: it has no RoPE, attention_dropout, ...)
        vocab_size=50257, max_position_embeddings=1024, hidden_size=768, num_hidden_layers=12,
        num_attention_heads=12, intermediate_size=None, hidden_act="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1,
        attn_pdrop=0.1, rms_norm_eps=1e-5, initializer_range=0.02, tie_word_embeddings=True, pad_token_id=None,
        scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
        add_cross_attention=False)),
    frozenset({"n_embd", "n_layer", "n_head", "n_inner", "n_positions", "layer_norm_epsilon",
               "activation_function", "resid_pdrop", "embd_pdrop", "attn_pdrop", "scale_attn_weights",
               "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention",
               "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
               "summary_first_dropout", "n_ctx"}),  # n_ctx: older configs' copy of n_positions, unused
    _read, lambda spec: {},
    aliases={"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
             "n_inner": "intermediate_size", "n_positions": "max_position_embeddings",
             "layer_norm_epsilon": "rms_norm_eps", "activation_function": "hidden_act"},
    activations=("gelu_new", "gelu", "gelu_pytorch_tanh"), prepare=_prepare,
    drops=frozenset({"num_key_value_heads", "rope_theta", "rope_parameters", "rope_scaling", "head_dim"}))

PRESETS = tuple(
    # openai-community/gpt2, gpt2-medium, gpt2-large, gpt2-xl config.json (the GPT-2 paper's four sizes;
    # their model cards count 124M, 355M, 774M and 1.5B, transformers 124,439,808, 354,823,168,
    # 774,030,080 and 1,557,611,200 with the head tied): vocabulary 50257, 1024 positions, MLP 4 x hidden.
    dict(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=heads, ffn_hidden=4 * H, vocab=50257,
         tied_embeddings=True, max_position=1024, norm_eps=1e-5)
    for name, L, H, heads in (("gpt2-124m", 12, 768, 12), ("gpt2-355m", 24, 1024, 16), ("gpt2-774m", 36, 1280, 20),
                              ("gpt2-1.5b", 48, 1600, 25)))

FAMILY = ModelFamily("gpt2", "LayerNorm, learned positions, biased fused q/k/v, plain GELU MLP (GPT-2)",
                     projections, kernels, tensors, hf=HF, norm_tensors=("weight", "bias"), qkv_bias=True,
                     check=_check, learned_positions=True, layer_prefix="transformer.h.",
                     embedding_name="transformer.wte.weight", final_norm_name="transformer.ln_f",
                     position_embedding_name="transformer.wpe.weight", presets=PRESETS)
