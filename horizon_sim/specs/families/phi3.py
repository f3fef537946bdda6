"""Phi-3 and Phi-4 (Phi3ForCausalLM, model_type phi3): Llama's block with q, k and v fused in
one projection (self_attn.qkv_proj: q's rows, then k's, then v's) and gate and up in one
(mlp.gate_up_proj: gate's rows first), no biases, RMSNorm, one optional sliding window on every
layer (Phi-3-mini's 2047). The fused tensors are held, loaded and saved fused, as checkpoints
store them.

HF config: sliding_window -> layer_windows (null: none); resid_pdrop and embd_pdrop must be 0
(no dropout in training here); longrope RoPE (Phi-3-mini-128k, Phi-3.5, Phi-4-mini: specs/rope.py)
with the top-level original_max_position_embeddings, which transformers prefers to the rope
parameters' own and which the writer therefore writes with it; partial_rotary_factor (Phi-4-mini's
0.75) -> rotary_fraction."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import Kernel, Projection, attention_kernels, block_tensors, dense_mlp_kernels
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import HfFamily, defaults_with, one_window
from horizon_sim.specs.hf_values import as_float
from horizon_sim.specs.rope import RopeScaling


def projections(m):
    H, q, kv, F = m.hidden, m.q_dim, m.kv_dim, m.ffn_hidden
    return (Projection("self_attn.qkv_proj", H, q + 2 * kv, False), Projection("self_attn.o_proj", q, H, False, inner=True),
            Projection("mlp.gate_up_proj", H, 2 * F, False), Projection("mlp.down_proj", F, H, False, inner=True))


def kernels(m):
    """Llama's, each fused output split after its norm: q|k|v (v copied out), gate|up."""
    norm1, *attn = attention_kernels(m, qk_norm=False, readers=1)
    norm2, *mlp = dense_mlp_kernels(m, gated=True, fused=True)
    return (norm1, Kernel("split", "attention", m.q_dim + 2 * m.kv_dim, kv_width=m.kv_dim), *attn,
            norm2, Kernel("split", "mlp", 2 * m.ffn_hidden), *mlp)


def tensors(m):
    qkv, o, *mlp = projections(m)
    return block_tensors(m, (o, qkv, *mlp))  # Phi3Attention defines o_proj before qkv_proj


def _check(m) -> None:
    if m.qkv_bias or m.mlp_bias:
        raise HorizonError(f"model {m.name!r}: phi3 has no biases (qkv_bias={m.qkv_bias}, mlp_bias={m.mlp_bias})")


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    for key in ("resid_pdrop", "embd_pdrop"):
        if as_float(cfg.get(key, 0.0), key, where, strict=False) != 0.0:
            raise HorizonError(f"{where}: {key} = {cfg[key]!r}; Horizon trains without dropout (want 0)")
    return dict(layer_windows=one_window(cfg, where, n_layers))


def _export(spec) -> dict:
    if len(set(spec.layer_windows)) > 1:
        raise HorizonError(f"model {spec.name!r}: phi3 has one sliding window on every layer, the layers want "
                           f"{sorted(set(spec.layer_windows))}")
    out = {"sliding_window": spec.layer_windows[0] if spec.layer_windows else None,
           "resid_pdrop": 0.0, "embd_pdrop": 0.0}
    if spec.rope_scaling is not None and spec.rope_scaling.kind == "longrope":  # else the class's 4096 wins
        out["original_max_position_embeddings"] = spec.rope_scaling.original_max_position
    return out


# microsoft/Phi-4-mini-instruct config.json's rope_scaling (transformers 4.45 format; as copied in the
# tests of an MLX port of its 4-bit conversion): longrope on 96 of each head's 128 dimensions, short
# factors 1 (the 4k pretraining context), long factors from 1 to 47.77 up to 131072 positions.
PHI4_MINI_ROPE = RopeScaling(kind="longrope", original_max_position=4096, short_factor=(1.0,) * 48, long_factor=(
    1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649, 2.446418898,
    2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
    6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23,
    32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77))

PRESETS = (
    # microsoft/Phi-3-mini-4k-instruct config.json: 32 kv heads, a 2047-token sliding window on every
    # layer, pad_token_id 32000 (its embedding row never trains), 4k context.
    dict(name="phi-3-mini", n_layers=32, hidden=3072, n_heads=32, n_kv_heads=32, ffn_hidden=8192, vocab=32064,
         norm_eps=1e-5, rope_theta=1e4, max_position=4096, layer_windows=(2047,) * 32, padding_idx=32000),
    # microsoft/Phi-3-medium-4k-instruct config.json: Phi-3-mini's vocabulary, window and pad token on
    # 40 layers of 5120 with 40 heads and 10 kv heads, MLP 17920 (13,960,238,080 parameters as counted
    # for unsloth/Phi-3-medium-4k-instruct).
    dict(name="phi-3-medium", n_layers=40, hidden=5120, n_heads=40, n_kv_heads=10, ffn_hidden=17920, vocab=32064,
         norm_eps=1e-5, rope_theta=1e4, max_position=4096, layer_windows=(2047,) * 40, padding_idx=32000),
    # microsoft/phi-4 config.json (model_type phi3): 10 kv heads, rope_theta 250000, 16k context, no
    # window, vocab 100352, pad_token_id 100257 (the config of the transformers 4.47 release).
    dict(name="phi-4", n_layers=40, hidden=5120, n_heads=40, n_kv_heads=10, ffn_hidden=17920, vocab=100352,
         norm_eps=1e-5, rope_theta=2.5e5, max_position=16384, padding_idx=100257),
    # microsoft/Phi-4-mini-instruct config.json (above): 32 layers of 3072, 24 heads of 128, 8 kv heads,
    # MLP 8192, vocabulary 200064 tied, pad 199999, a 262144-token window (wider than its context),
    # 131072 positions by longrope over 3/4 of each head.
    dict(name="phi-4-mini", n_layers=32, hidden=3072, n_heads=24, n_kv_heads=8, ffn_hidden=8192, vocab=200064,
         norm_eps=1e-5, rope_theta=1e4, max_position=131072, tied_embeddings=True, padding_idx=199999,
         layer_windows=(262144,) * 32, rotary_fraction=0.75, rope_scaling=PHI4_MINI_ROPE),
)

HF = HfFamily(
    "phi3", "Phi3ForCausalLM",
    defaults_with(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, resid_pdrop=0.0, embd_pdrop=0.0,
                  max_position_embeddings=4096, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
                  sliding_window=None, pad_token_id=32000),
    frozenset({"resid_pdrop", "embd_pdrop", "original_max_position_embeddings", "sliding_window",
               "partial_rotary_factor"}), _read, _export,
    partial_rotary=True)

FAMILY = ModelFamily("phi3", "Llama's block with fused qkv and gate_up projections (Phi-3, Phi-4)",
                     projections, kernels, tensors, hf=HF, check=_check, presets=PRESETS)
