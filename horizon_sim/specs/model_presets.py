"""Named model presets. Shapes are copied from each model's published HF config.json; the
parameter totals are checked against transformers in tests/test_model_presets.py."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.rope import RopeScaling
from horizon_sim.units import closest

# meta-llama/Llama-3.1-*'s rope_scaling (Llama 3.2 and 3.3 use the same up to factor).
LLAMA31_ROPE = RopeScaling(kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position=8192)


def _llama2(name, L, H, heads, kv, F):
    # meta-llama/Llama-2-*-hf config.json: vocab 32000, rms_norm_eps 1e-5, rope_theta 1e4,
    # max_position_embeddings 4096.
    return ModelSpec(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv,
                     ffn_hidden=F, vocab=32000, norm_eps=1e-5, rope_theta=1e4, max_position=4096)


def _llama31(name, L, H, heads, F):
    # meta-llama/Llama-3.1-*: vocab 128256, 8 kv heads, rope_theta 5e5, 128k context by
    # llama3 RoPE scaling.
    return ModelSpec(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=8,
                     ffn_hidden=F, vocab=128256, norm_eps=1e-5, rope_theta=5e5,
                     rope_scaling=LLAMA31_ROPE, max_position=131072)


def _qwen25(name, L, H, heads, kv, F, vocab=152064, tied=False, ctx=131072):
    # Qwen/Qwen2.5-*: qkv bias, rms_norm_eps 1e-6, rope_theta 1e6, max_position_embeddings
    # 32768 (0.5B) or 131072 (7B and up); sliding window off (use_sliding_window false).
    return ModelSpec(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv,
                     ffn_hidden=F, vocab=vocab, tied_embeddings=tied, family="qwen2",
                     norm_eps=1e-6, rope_theta=1e6, max_position=ctx)


def _qwen3_moe(name, L, H, heads, F, I):
    # Qwen/Qwen3-30B-A3B and -235B-A22B config.json: 128 experts, 8 per token, norm_topk_prob
    # true, head_dim 128, 4 kv heads, rope_theta 1e6, 40960 positions, rms_norm_eps 1e-6,
    # decoder_sparse_step 1, mlp_only_layers [], output_router_logits false (so the aux loss,
    # router_aux_loss_coef 0.001, is not added to the loss), untied.
    return ModelSpec(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=4, head_dim=128,
                     ffn_hidden=F, vocab=151936, family="qwen3_moe", norm_eps=1e-6, rope_theta=1e6,
                     max_position=40960, n_experts=128, experts_per_token=8,
                     expert_ffn_hidden=I, norm_topk_prob=True)


PRESETS: dict[str, ModelSpec] = {
    m.name: m for m in (
        _llama2("llama-2-7b", 32, 4096, 32, 32, 11008),
        _llama2("llama-2-13b", 40, 5120, 40, 40, 13824),
        _llama2("llama-2-70b", 80, 8192, 64, 8, 28672),
        _llama31("llama-3.1-8b", 32, 4096, 32, 14336),
        _llama31("llama-3.1-70b", 80, 8192, 64, 28672),
        _llama31("llama-3.1-405b", 126, 16384, 128, 53248),
        _qwen25("qwen2.5-0.5b", 24, 896, 14, 2, 4864, vocab=151936, tied=True, ctx=32768),
        _qwen25("qwen2.5-7b", 28, 3584, 28, 4, 18944),
        _qwen25("qwen2.5-14b", 48, 5120, 40, 8, 13824),
        _qwen25("qwen2.5-32b", 64, 5120, 40, 8, 27648),
        _qwen25("qwen2.5-72b", 80, 8192, 64, 8, 29568),
        # Qwen/Qwen3-8B config.json: q/k norms, head_dim 128 (= 4096 / 32), rope_theta 1e6, 40960 positions.
        ModelSpec(name="qwen3-8b", n_layers=36, hidden=4096, n_heads=32, n_kv_heads=8,
                  ffn_hidden=12288, vocab=151936, family="qwen3", norm_eps=1e-6, rope_theta=1e6,
                  max_position=40960),
        # Mixture of experts (specs/moe.py): total_params counts every expert, active_params
        # the k a token meets (MFU counts those).
        _qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 6144, 768),
        _qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 12288, 1536),
        # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts of width 14336 (intermediate_size),
        # top-2 renormalised, rope_theta 1e6, 32768 positions, no sliding window, untied.
        ModelSpec(name="mixtral-8x7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8,
                  ffn_hidden=14336, vocab=32000, norm_eps=1e-5, rope_theta=1e6, max_position=32768,
                  family="mixtral", n_experts=8, experts_per_token=2, expert_ffn_hidden=14336,
                  norm_topk_prob=True),
        # mistralai/Mistral-7B-v0.3: vocab 32768, rope_theta 1e6, no sliding window, 32k context.
        ModelSpec(name="mistral-7b", family="mistral", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8,
                  ffn_hidden=14336, vocab=32768, norm_eps=1e-5, rope_theta=1e6, max_position=32768),
        # The paper's headline is "~120B dense on one H200 with 1.5 TB host RAM". Its exact
        # config is not published in a form we can copy, so this is a Llama-3-style dense
        # model sized to 119.8B: 76 blocks of 1.535B parameters (width 12288, 96 heads,
        # 8 kv heads, SwiGLU 32768) plus a 128256-token vocabulary, untied.
        ModelSpec(name="dense-120b", n_layers=76, hidden=12288, n_heads=96, n_kv_heads=8,
                  ffn_hidden=32768, vocab=128256, norm_eps=1e-5, rope_theta=5e5),
        # A small Llama-style model for demos and tests on a laptop CPU: byte-level vocabulary.
        ModelSpec(name="tiny", n_layers=8, hidden=256, n_heads=8, n_kv_heads=4,
                  ffn_hidden=688, vocab=256, norm_eps=1e-5, rope_theta=1e4),
    )
}


def model_preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise HorizonError(
            f"unknown model {name!r}{closest(name, PRESETS)}; presets: {', '.join(PRESETS)}, "
            "or a path to a config.json") from None
