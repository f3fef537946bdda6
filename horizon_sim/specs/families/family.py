"""ModelFamily: what one decoder family is, in one place (families/<name>.py builds one; the
registry, families/__init__.py, lists them). The planner's parameter counts, GEMM shapes and
kernel costs, the executor's weight layout and the HF config reader and writer all ask the
spec's family (ModelSpec.family) instead of branching on per-model booleans.

A family gives:
  projections(m)  the block's matmuls in the order its forward runs them (block_parts.Projection);
  kernels(m)      its other kernels in forward order (block_parts.Kernel; schedule/work.py prices
                  each by its kind);
  tensors(m)      every tensor of the block, (name, shape) in transformers' order (the executor's
                  layout and checkpoint names);
  hf              its transformers config row (hf_families.HfFamily), or None when no config.json
                  maps to it yet (the planner prices it; `--model config.json` cannot name it);
  check(m)        its one-line refusals of a spec it cannot be;
  presets         its named models' ModelSpec fields, with their sources.
The executor runs a family when horizon_exec/model/families registers a forward under its name;
every other family is refused there by name."""
from dataclasses import dataclass
from typing import Callable


def _no_check(m) -> None:
    return None


@dataclass(frozen=True, slots=True)
class MoeTraits:
    """How a mixture-of-experts family's MLP differs from the others' (specs/moe.py)."""
    router_first: bool
    """The router weight (mlp.gate) precedes the experts in transformers' parameter order."""
    fp32_routing_weights: bool = False
    """The router returns its top-k weights in fp32 (Mixtral; Qwen's cast them to the activation
    dtype): an expert's output times its weight is an fp32 product, cast back before the sum."""
    shared_expert: bool = False
    """A dense SwiGLU shared expert beside the routed ones, gated per token by a sigmoid (Qwen2-MoE)."""
    always_norm_topk: bool = False
    """The k routing weights are always renormalised (Mixtral); otherwise norm_topk_prob says."""
    windows: bool = False
    """Its layers may attend through sliding windows (gpt-oss); other MoE families refuse them."""
    shared_gate: bool = True
    """A shared expert (shared_expert_ffn_hidden > 0) is scaled per token by a sigmoid gate
    (Qwen2-MoE's mlp.shared_expert_gate); DeepSeek's shared experts are added ungated."""
    scoring: str = "softmax"
    """The router's scores: a softmax over the E logits ('softmax'), or each logit's sigmoid
    ('sigmoid': DeepSeek-V3, which picks its top-k by the scores plus a per-expert correction
    bias, mlp.gate.e_score_correction_bias, a buffer no gradient moves)."""
    group_score: str = "max"
    """With expert groups (ModelSpec.expert_groups): a group's score is its best expert's
    ('max': DeepSeek-V2) or the sum of its best two ('top2': DeepSeek-V3)."""
    dense_first: bool = False
    """Its first blocks may have a dense MLP (ModelSpec.first_dense_layers: DeepSeek)."""
    stored_per_expert: bool = True
    """Its checkpoints keep the hub's per-expert tensors (horizon_exec/checkpoints/hf_experts.py);
    gpt-oss's store the stacks as transformers holds them (or as MXFP4 blocks and scales)."""


@dataclass(frozen=True, slots=True)
class ModelFamily:
    name: str
    """Registry key; the transformers model_type when `hf` maps one."""
    summary: str
    """What its block is, in a few words (errors, `horizon plan --help`, docs/families.md)."""
    projections: Callable
    kernels: Callable
    tensors: Callable
    hf: object = None
    """Its hf_families.HfFamily row, or None."""
    norm_tensors: tuple[str, ...] = ("weight",)
    """One norm's tensors (RMSNorm a weight; LayerNorm a weight and a bias): the final norm too."""
    qkv_bias: bool = False
    """Whether q, k and v carry biases when the spec does not say (ModelSpec.qkv_bias None)."""
    moe: MoeTraits | None = None
    """None for a dense family."""
    check: Callable = _no_check
    buffers: Callable = lambda m: ()
    """(name, shape) of a block's tensors that are not parameters but are part of the model
    (transformers' persistent buffers, fp32; DeepSeek-V3's router correction bias): loaded and
    saved with the weights, resident on the device, never trained (model/block_buffers.py)."""
    softcapping: bool = False
    """Its attention scores and logits may be soft-capped and its queries scaled otherwise than by
    head_dim (ModelSpec.attn_softcap, logit_softcap, query_scale: Gemma 2)."""
    local_rope: bool = False
    """Its sliding layers may take a RoPE base of their own (ModelSpec.rope_local_theta: Gemma 3)."""
    attention_sinks: bool = False
    """Each attention head has a learned sink logit in its softmax (gpt-oss's self_attn.sinks):
    the attention runs in chunks of query rows (Kernel.sinks)."""
    extra_layers: bool = False
    """Its checkpoints may carry layers past the last block that transformers does not build
    (DeepSeek-V3's multi-token-prediction module): dropped on load, with a message."""
    mla: bool = False
    """Its attention is multi-head latent attention (ModelSpec.kv_lora_rank and the MLA fields:
    DeepSeek-V2/V3, specs/mla.py)."""
    clamped_swiglu: bool = False
    """Its experts' gate is gpt-oss's clamped SwiGLU (ModelSpec.swiglu_alpha, swiglu_limit)."""
    learned_positions: bool = False
    """A learned position embedding (max_position rows) beside the token embedding (GPT-2's wpe),
    in the embedding unit after the token rows (position_embedding_name); RoPE otherwise."""
    position_embedding_name: str = ""
    """transformers' name of the learned position embedding (learned_positions)."""
    layer_prefix: str = "model.layers."
    """transformers' name prefix of block N's tensors (`<prefix>N.`)."""
    embedding_name: str = "model.embed_tokens.weight"
    """transformers' names of the token embedding, the final norm (its tensors `<name>.<t>`
    for t in norm_tensors) and the LM head (absent from a tied model's weights)."""
    final_norm_name: str = "model.norm"
    head_name: str = "lm_head.weight"
    presets: tuple = ()
    """Its named presets: each a dict of ModelSpec fields (the family implied), with its source
    in a comment beside it (specs/model_presets.py collects them; tests/test_model_presets.py
    counts each against transformers)."""

    @property
    def is_moe(self) -> bool:
        return self.moe is not None
