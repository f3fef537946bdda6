"""Mixture-of-experts blocks: the families Horizon describes exactly (as transformers 5 builds
them) and the checks a ModelSpec's MoE fields must pass.

Every supported family routes alike (transformers' Qwen3MoeTopKRouter, Qwen2MoeTopKRouter and
MixtralTopKRouter): router logits = x . W_gate^T (E per token), a softmax over all E in fp32,
top-k of the probabilities, then (norm_topk_prob, always for Mixtral) the k weights divided by
their sum, which equals a softmax over the k chosen logits (Mixtral's "renormalised top-2").
The auxiliary load-balancing loss (Switch Transformer eq. 4-6, `load_balancing_loss_func`) is
added to the loss times router_aux_loss_coef only when the config sets output_router_logits;
the spec's router_aux_loss_coef is what the training loss applies (0 = none).

Families differ in what the block holds and in transformers' parameter order:
  qwen3_moe  q/k norms; mlp.experts.{gate_up_proj, down_proj}, then mlp.gate
  mixtral    mlp.gate, then mlp.experts.{gate_up_proj, down_proj}; norm_topk_prob always
  qwen2_moe  q/k/v biases (qkv_bias); mlp.gate, the experts, then a shared expert
             (mlp.shared_expert.{gate,up,down}_proj) scaled per token by sigmoid(x . w) with
             w = mlp.shared_expert_gate.weight (1 x H), added to the experts' output.
Every block is an MoE block (decoder_sparse_step 1, no mlp_only_layers): hf_config refuses
the others by name, since the planner and the executor's slots assume one block shape."""
from horizon_sim.errors import HorizonError

MOE_FAMILIES = ("qwen3_moe", "mixtral", "qwen2_moe")
ROUTER_FIRST = ("mixtral", "qwen2_moe")
"""Families whose router weight precedes the experts' in transformers' parameter order."""
FP32_ROUTING_WEIGHTS = ("mixtral",)
"""Families whose router returns its top-k weights in fp32 (Qwen's cast them to the activation
dtype): an expert's output times its weight is then an fp32 product, cast back before the sum."""


def check(m) -> None:
    """One-line errors for MoE fields that no supported family has (m: a ModelSpec)."""
    moe = (m.n_experts, m.experts_per_token, m.expert_ffn_hidden, m.shared_expert_ffn_hidden)
    for f, v in zip(("n_experts", "experts_per_token", "expert_ffn_hidden", "shared_expert_ffn_hidden"), moe):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise HorizonError(f"model {f}={v!r} must be an integer >= 0 (0 = dense)")
    c = m.router_aux_loss_coef
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < float("inf"):
        raise HorizonError(f"model router_aux_loss_coef={c!r} must be a finite number >= 0 (0 = no aux loss)")
    if not isinstance(m.norm_topk_prob, bool):
        raise HorizonError(f"model norm_topk_prob={m.norm_topk_prob!r} must be true or false")
    if not m.moe_family:
        if any(moe) or m.norm_topk_prob or c:
            raise HorizonError("model has MoE fields (n_experts, experts_per_token, ...) but no moe_family; "
                               f"set moe_family to one of {', '.join(MOE_FAMILIES)}")
        return
    if m.moe_family not in MOE_FAMILIES:
        raise HorizonError(f"model moe_family={m.moe_family!r}; allowed: {', '.join(MOE_FAMILIES)} "
                           "(or '' for a dense model)")
    if m.n_experts < 2 or not 1 <= m.experts_per_token <= m.n_experts:
        raise HorizonError(f"model {m.moe_family}: n_experts={m.n_experts} must be >= 2 and experts_per_token="
                           f"{m.experts_per_token} in 1..n_experts")
    if m.expert_ffn_hidden <= 0:
        raise HorizonError(f"model {m.moe_family}: expert_ffn_hidden={m.expert_ffn_hidden} must be > 0")
    if (m.shared_expert_ffn_hidden > 0) != (m.moe_family == "qwen2_moe"):
        raise HorizonError(f"model {m.moe_family}: shared_expert_ffn_hidden={m.shared_expert_ffn_hidden}; "
                           "qwen2_moe has a shared expert (> 0), the others none (0)")
    if m.moe_family == "mixtral" and m.ffn_hidden != m.expert_ffn_hidden:
        raise HorizonError(f"model mixtral: ffn_hidden={m.ffn_hidden} must equal expert_ffn_hidden="
                           f"{m.expert_ffn_hidden} (Mixtral's experts are intermediate_size wide)")
    if m.moe_family == "mixtral" and not m.norm_topk_prob:
        raise HorizonError("model mixtral: norm_topk_prob must be true (Mixtral always renormalises its top-k)")
    if m.ffn_type != "gated" or m.norm != "rmsnorm" or m.mlp_bias:
        raise HorizonError(f"model {m.moe_family}: experts are SwiGLU without biases, with RMSNorm "
                           f"(not {m.ffn_type} MLP, {m.norm}, mlp_bias={m.mlp_bias})")
    if m.qk_norm != (m.moe_family == "qwen3_moe"):
        raise HorizonError(f"model {m.moe_family}: qk_norm={m.qk_norm}; qwen3_moe has q/k norms, the others none")
    if m.qkv_bias and m.moe_family != "qwen2_moe":
        raise HorizonError(f"model {m.moe_family}: qkv_bias=True; only qwen2_moe has q/k/v biases alone")
    if m.layer_windows:
        raise HorizonError(f"model {m.moe_family}: sliding windows in an MoE model are not supported")


def params_label(m) -> str:
    """'30.53B params' (dense) or '30.53B params, 3.35B active (MFU counts active)' (MoE): what the
    CLI prints beside a model's name, so an MoE model's MFU is read against the right N."""
    total = f"{m.total_params / 1e9:.2f}B params"
    return f"{total}, {m.active_params / 1e9:.2f}B active (MFU counts active)" if m.n_experts else total
