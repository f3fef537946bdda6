"""GPT-NeoX and Pythia (GPTNeoXForCausalLM, model_type gpt_neox): LayerNorm with a bias before
attention and before the MLP, both fed the block's input and added to it together (the parallel
residual: x + attention(ln1(x)) + mlp(ln2(x))), q/k/v in one projection (attention.query_key_value,
its output per head [q | k | v]; biased with attention.dense when attention_bias), RoPE on part
of each head (rotary_pct, 0.25 in Pythia and GPT-NeoX-20B: ModelSpec.rotary_fraction), a plain
GELU MLP with biases (erf GELU, or the tanh forms GPT-NeoX-20B's gelu_fast and gelu_new:
ModelSpec.hidden_act), an untied head (embed_out in checkpoints). The executor runs it
(horizon_exec/model/families/gpt_neox.py); hidden dropout is not run (0 in the released
configs).

HF config: layer_norm_eps, rotary_pct (0.25 when absent, as transformers reads it) and
rotary_emb_base (4.x names) or rope_parameters' partial_rotary_factor and rope_theta,
attention_bias, use_parallel_residual (false is refused: the sequential residual is not
described), classifier_dropout (a classification head's, unused)."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import Kernel, Projection, block_tensors
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import HfFamily, defaults_with
from horizon_sim.specs.hf_values import as_bool

LN = ("weight", "bias")


def projections(m):
    H, F = m.hidden, m.ffn_hidden
    return (Projection("attention.query_key_value", H, 3 * H, m.qkv_bias), Projection("attention.dense", H, H, m.qkv_bias, inner=True),
            Projection("mlp.dense_h_to_4h", H, F, True), Projection("mlp.dense_4h_to_h", F, H, True, inner=True))


def kernels(m):
    """LayerNorm of x, q|k|v split per head (v copied out), RoPE on the first rotary_dim of each
    head of q and k (the gradient taken by the split as it is), attention, the add x1 = x +
    attention; LayerNorm of x again (the parallel residual), the GELU, the add y = x1 + MLP."""
    H, q, kv = m.hidden, m.q_dim, m.kv_dim
    rope = dict(rotary=m.rotary_fraction, grad_copied=False)
    return (Kernel("layernorm", "attention", H, output_saved=True, reads_block_input=True),
            Kernel("split", "attention", q + 2 * kv, kv_width=kv),
            Kernel("rope", "attention", q, **rope), Kernel("rope", "attention", kv, **rope),
            Kernel("attention", "attention", q, rows=m.n_heads, kv_width=kv),
            Kernel("residual", "attention", H),
            Kernel("layernorm", "mlp", H, output_saved=True, reads_block_input=True),
            Kernel("silu", "mlp", m.ffn_hidden),  # the GELU: a plain activation's bytes
            Kernel("residual", "mlp", H))


def tensors(m):
    norms = tuple((f"{n}.{t}", (m.hidden,)) for n in ("input_layernorm", "post_attention_layernorm") for t in LN)
    return (*norms, *block_tensors(m, projections(m), norm_tensors=()))


def _check(m) -> None:
    if m.n_kv_heads != m.n_heads or m.hd * m.n_heads != m.hidden:
        raise HorizonError(f"model {m.name!r}: gpt_neox has n_kv_heads = n_heads and head_dim = hidden / n_heads "
                           f"(not {m.n_kv_heads} kv heads of {m.hd})")


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    if not as_bool(cfg, "use_parallel_residual", where, True):
        raise HorizonError(f"{where}: use_parallel_residual = false (a sequential residual) is not supported for "
                           "gpt_neox")
    return dict(qkv_bias=as_bool(cfg, "attention_bias", where, True))


HF = HfFamily(
    "gpt_neox", "GPTNeoXForCausalLM",
    defaults_with(vocab_size=50432, hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
                  intermediate_size=24576, hidden_act="gelu", hidden_dropout=0.0, classifier_dropout=0.1,
                  max_position_embeddings=2048, rms_norm_eps=1e-5, use_parallel_residual=True,
                  attention_bias=True),
    frozenset({"layer_norm_eps", "rotary_pct", "rotary_emb_base", "partial_rotary_factor", "hidden_dropout",
               "classifier_dropout", "use_parallel_residual", "attention_bias"}),
    _read, lambda spec: {"use_parallel_residual": True, "attention_bias": spec.qkv_bias},
    aliases={"layer_norm_eps": "rms_norm_eps", "rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"},
    activations=("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh"),
    prepare=lambda cfg: {"partial_rotary_factor": 0.25, **cfg},  # GPTNeoXConfig: rotary_pct defaults to 0.25
    drops=frozenset({"num_key_value_heads", "head_dim"}), partial_rotary=True)

PRESETS = (
    # EleutherAI/gpt-neox-20b: GPTNeoXConfig's defaults are its config (transformers' docstring checkpoint):
    # 44 layers of 6144, 64 heads, MLP 24576, vocab 50432, rotary_pct 0.25, 2048 positions, untied.
    # Its config.json's hidden_act is gelu_fast (the tanh approximation); Pythia's are gelu.
    dict(name="gpt-neox-20b", n_layers=44, hidden=6144, n_heads=64, n_kv_heads=64, ffn_hidden=24576, vocab=50432,
         norm_eps=1e-5, rope_theta=1e4, rotary_fraction=0.25, max_position=2048, hidden_act="gelu_fast"),
    # EleutherAI/pythia-1b ... -12b config.json (the suite of arXiv 2304.01373; as released they hold
    # 1,011,781,632, 1,414,647,808, 2,775,208,960, 6,857,302,016 and 11,846,072,320 parameters): MLP 4x
    # hidden, rotary_pct 0.25, 2048 positions, untied head; the vocabulary padded per size.
    *(dict(name=f"pythia-{size}", n_layers=L, hidden=H, n_heads=heads, n_kv_heads=heads, ffn_hidden=4 * H,
           vocab=vocab, norm_eps=1e-5, rope_theta=1e4, rotary_fraction=0.25, max_position=2048)
      for size, L, H, heads, vocab in (("1b", 16, 2048, 8, 50304), ("1.4b", 24, 2048, 16, 50304),
                                       ("2.8b", 32, 2560, 32, 50304), ("6.9b", 32, 4096, 32, 50432),
                                       ("12b", 36, 5120, 40, 50688))),
)

FAMILY = ModelFamily("gpt_neox", "parallel-residual LayerNorm blocks, partial RoPE, biased fused q/k/v, plain GELU MLP "
                     "(GPT-NeoX, Pythia)", projections, kernels, tensors, hf=HF,
                     norm_tensors=LN, qkv_bias=True, check=_check, layer_prefix="gpt_neox.layers.", presets=PRESETS,
                     embedding_name="gpt_neox.embed_in.weight", final_norm_name="gpt_neox.final_layer_norm",
                     head_name="embed_out.weight")
