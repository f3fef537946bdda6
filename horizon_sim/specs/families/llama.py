"""Llama (LlamaForCausalLM): RMSNorm before attention and before the MLP, q/k/v/o projections
without biases, RoPE, a SwiGLU MLP (biases when the config's mlp_bias), untied or tied head.
The block Qwen2 and Mistral share (their modules reuse these three functions).

HF config: mlp_bias -> mlp_bias; attention_bias true (a bias on o too) is refused."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.block_parts import (attention_kernels, attention_projections, block_tensors,
                                           dense_mlp_kernels, gated_mlp_projections)
from horizon_sim.specs.families.family import ModelFamily
from horizon_sim.specs.hf_families import HfFamily, defaults_with, refuse_attention_bias
from horizon_sim.specs.hf_values import as_bool
from horizon_sim.specs.rope import RopeScaling

# meta-llama/Llama-3.1-*'s rope_scaling (Llama 3.2 and 3.3 use the same up to factor).
LLAMA31_ROPE = RopeScaling(kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position=8192)


def _llama2(name, L, H, heads, kv, F):
    # meta-llama/Llama-2-*-hf config.json: vocab 32000, rms_norm_eps 1e-5, rope_theta 1e4,
    # max_position_embeddings 4096.
    return dict(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv,
                ffn_hidden=F, vocab=32000, norm_eps=1e-5, rope_theta=1e4, max_position=4096)


def _llama31(name, L, H, heads, F):
    # meta-llama/Llama-3.1-*: vocab 128256, 8 kv heads, rope_theta 5e5, 128k context by
    # llama3 RoPE scaling.
    return dict(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=8,
                ffn_hidden=F, vocab=128256, norm_eps=1e-5, rope_theta=5e5,
                rope_scaling=LLAMA31_ROPE, max_position=131072)


PRESETS = (
    _llama2("llama-2-7b", 32, 4096, 32, 32, 11008),
    _llama2("llama-2-13b", 40, 5120, 40, 40, 13824),
    _llama2("llama-2-70b", 80, 8192, 64, 8, 28672),
    _llama31("llama-3.1-8b", 32, 4096, 32, 14336),
    _llama31("llama-3.1-70b", 80, 8192, 64, 28672),
    _llama31("llama-3.1-405b", 126, 16384, 128, 53248),
    # The paper's headline is "~120B dense on one H200 with 1.5 TB host RAM". Its exact
    # config is not published in a form we can copy, so this is a Llama-3-style dense
    # model sized to 119.8B: 76 blocks of 1.535B parameters (width 12288, 96 heads,
    # 8 kv heads, SwiGLU 32768) plus a 128256-token vocabulary, untied.
    dict(name="dense-120b", n_layers=76, hidden=12288, n_heads=96, n_kv_heads=8,
         ffn_hidden=32768, vocab=128256, norm_eps=1e-5, rope_theta=5e5),
    # A small Llama-style model for demos and tests on a laptop CPU: byte-level vocabulary.
    dict(name="tiny", n_layers=8, hidden=256, n_heads=8, n_kv_heads=4,
         ffn_hidden=688, vocab=256, norm_eps=1e-5, rope_theta=1e4),
)


def projections(m):
    return (*attention_projections(m, m.qkv_bias), *gated_mlp_projections(m, m.mlp_bias))


def kernels(m):
    return (*attention_kernels(m, qk_norm=False), *dense_mlp_kernels(m, gated=True))


def tensors(m):
    return block_tensors(m, projections(m))


def _read(cfg: dict, where: str, n_layers: int) -> dict:
    refuse_attention_bias(cfg, "llama", where)
    return dict(mlp_bias=as_bool(cfg, "mlp_bias", where, False))


def _export(spec) -> dict:
    if spec.qkv_bias:
        raise HorizonError(f"model {spec.name!r}: llama has no q/k/v biases alone (its attention_bias also "
                           "biases o); family qwen2 has them")
    if spec.layer_windows:
        raise HorizonError(f"model {spec.name!r}: llama has no sliding windows; family mistral (one window "
                           "on every layer) or qwen2 (per layer) has them")
    return {"attention_bias": False, "mlp_bias": spec.mlp_bias}


HF = HfFamily(
    "llama", "LlamaForCausalLM",
    defaults_with(intermediate_size=11008, num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
                  attention_bias=False, mlp_bias=False),
    frozenset({"attention_bias", "mlp_bias"}), _read, _export)

FAMILY = ModelFamily("llama", "RMSNorm, RoPE, SwiGLU MLP (Llama 2/3)", projections, kernels, tensors, hf=HF,
                     presets=PRESETS)
