"""Mixture-of-experts blocks: the families Horizon describes exactly (as transformers 5 builds
them) and the checks a ModelSpec's MoE fields must pass.

Every supported family routes alike (transformers' Qwen3MoeTopKRouter, Qwen2MoeTopKRouter and
MixtralTopKRouter): router logits = x . W_gate^T (E per token), a softmax over all E in fp32,
top-k of the probabilities, then (norm_topk_prob, always for Mixtral) the k weights divided by
their sum, which equals a softmax over the k chosen logits (Mixtral's "renormalised top-2").
The auxiliary load-balancing loss (Switch Transformer eq. 4-6, `load_balancing_loss_func`) is
added to the loss times router_aux_loss_coef only when the config sets output_router_logits;
the spec's router_aux_loss_coef is what the training loss applies (0 = none).

Families differ in what the block holds and in transformers' parameter order (each family's
module in specs/families says how, with its MoeTraits): qwen3_moe, mixtral, qwen2_moe.
Every block is an MoE block (decoder_sparse_step 1, no mlp_only_layers): hf_config refuses
the others by name, since the planner and the executor's slots assume one block shape."""
from horizon_sim.errors import HorizonError


def check(m, fam) -> None:
    """One-line errors for MoE fields that the spec's family (fam, a ModelFamily) cannot have."""
    moe = (m.n_experts, m.experts_per_token, m.expert_ffn_hidden, m.shared_expert_ffn_hidden)
    for f, v in zip(("n_experts", "experts_per_token", "expert_ffn_hidden", "shared_expert_ffn_hidden"), moe):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise HorizonError(f"model {f}={v!r} must be an integer >= 0 (0 = dense)")
    c = m.router_aux_loss_coef
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < float("inf"):
        raise HorizonError(f"model router_aux_loss_coef={c!r} must be a finite number >= 0 (0 = no aux loss)")
    if not isinstance(m.norm_topk_prob, bool):
        raise HorizonError(f"model norm_topk_prob={m.norm_topk_prob!r} must be true or false")
    for f in ("first_dense_layers", "expert_groups", "topk_groups"):
        v = getattr(m, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise HorizonError(f"model {f}={v!r} must be an integer >= 0")
    r = m.routed_scaling
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r < float("inf"):
        raise HorizonError(f"model routed_scaling={r!r} must be a finite number > 0 (1 = unscaled)")
    deepseek = (m.first_dense_layers, m.expert_groups, m.topk_groups, r != 1)
    if any(deepseek) and not (fam.is_moe and fam.moe.dense_first):
        raise HorizonError(f"model has DeepSeek's routing fields (first_dense_layers, expert_groups, topk_groups, "
                           f"routed_scaling) but family {fam.name!r} has none (deepseek_v2 and deepseek_v3 have)")
    if not fam.is_moe:
        if any(moe) or m.norm_topk_prob or c:
            from horizon_sim.specs.families import MOE_FAMILIES
            raise HorizonError(f"model has MoE fields (n_experts, experts_per_token, ...) but family {fam.name!r} "
                               f"is dense; MoE families: {', '.join(MOE_FAMILIES)}")
        return
    name = fam.name
    if fam.moe.dense_first and not any(moe):  # a dense model of a family whose first blocks are dense
        if m.first_dense_layers or m.norm_topk_prob or c or m.expert_groups or m.topk_groups or r != 1:
            raise HorizonError(f"model {name}: routing fields without experts (n_experts=0: every block dense)")
        return
    if m.n_experts < 2 or not 1 <= m.experts_per_token <= m.n_experts:
        raise HorizonError(f"model {name}: n_experts={m.n_experts} must be >= 2 and experts_per_token="
                           f"{m.experts_per_token} in 1..n_experts")
    if m.expert_ffn_hidden <= 0:
        raise HorizonError(f"model {name}: expert_ffn_hidden={m.expert_ffn_hidden} must be > 0")
    if (m.shared_expert_ffn_hidden > 0) != fam.moe.shared_expert:
        raise HorizonError(f"model {name}: shared_expert_ffn_hidden={m.shared_expert_ffn_hidden}; "
                           + ("it has a shared expert (> 0)" if fam.moe.shared_expert else "it has no shared expert (0)"))
    if fam.moe.always_norm_topk and not m.norm_topk_prob:
        raise HorizonError(f"model {name}: norm_topk_prob must be true ({name} always renormalises its top-k)")
    if m.mlp_bias:
        raise HorizonError(f"model {name}: experts are SwiGLU without biases (not mlp_bias={m.mlp_bias})")
    if m.first_dense_layers >= m.n_layers:
        raise HorizonError(f"model {name}: first_dense_layers={m.first_dense_layers} must be below its {m.n_layers} "
                           "blocks (every block dense: n_experts=0)")
    if m.expert_groups and (m.n_experts % m.expert_groups or not 1 <= m.topk_groups <= m.expert_groups):
        raise HorizonError(f"model {name}: expert_groups={m.expert_groups} must divide n_experts={m.n_experts} and "
                           f"topk_groups={m.topk_groups} lie in 1..expert_groups")
    if m.expert_groups and m.experts_per_token > m.topk_groups * (m.n_experts // m.expert_groups):
        raise HorizonError(f"model {name}: experts_per_token={m.experts_per_token} exceeds the experts of its "
                           f"{m.topk_groups} chosen groups")
    if m.topk_groups and not m.expert_groups:
        raise HorizonError(f"model {name}: topk_groups={m.topk_groups} without expert_groups")
    if m.layer_windows and not fam.moe.windows:
        raise HorizonError(f"model {name}: sliding windows in an MoE model are not supported (gpt_oss has them)")


def params_label(m) -> str:
    """'30.53B params' (dense) or '30.53B params, 3.35B active (MFU counts active)' (MoE): what the
    CLI prints beside a model's name, so an MoE model's MFU is read against the right N."""
    total = f"{m.total_params / 1e9:.2f}B params"
    return f"{total}, {m.active_params / 1e9:.2f}B active (MFU counts active)" if m.n_experts else total
