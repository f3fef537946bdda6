"""DeepSeek-V2/V3's MoE MLP as a plain function of named weights: transformers 5's DeepseekV2Moe /
DeepseekV3MoE (fp32 results match them to rounding), with one difference that changes no value:
the experts are chosen without autograd and the chosen scores gathered, the values transformers'
top-k returns, so the backward keeps only the chosen scores (not the group choice's tensors).

Router (mlp.gate, computed in fp32 on the fp32 input, as transformers keeps it):
- V2: softmax scores; greedy top-k, or with expert groups the scores outside the topk_group
  groups of highest best score set to 0 first; the k weights times routed_scaling_factor.
- V3: sigmoid scores; the top-k chosen by the scores plus the correction bias
  (mlp.gate.e_score_correction_bias, a buffer: model/block_buffers.py), among the topk_group
  groups of highest top-two sum (the others at -inf); the weights are the chosen experts' scores
  (without the bias), renormalised (norm_topk_prob, + 1e-20), times routed_scaling_factor.
The weights stay fp32 (moe_block.routed_experts casts each expert's weighted rows back); the
routed experts as Qwen's (moe_block.routed_experts); the shared experts (one dense SwiGLU,
mlp.shared_experts) added ungated after them."""
import torch
import torch.nn.functional as F

from horizon_exec.model.layers import swiglu_mlp
from horizon_exec.model.moe_block import expert_rows, routed_experts
from horizon_sim.specs.families import family
from horizon_sim.specs.model import ModelSpec


def _group_mask(m, choice, group_score):
    """bool (N, E): the experts of each row's topk_groups best groups (by group_score (N, G))."""
    G = m.expert_groups
    idx = torch.topk(group_score, k=m.topk_groups, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_score).scatter_(1, idx, 1)
    return mask.unsqueeze(-1).expand(-1, G, m.n_experts // G).reshape(-1, m.n_experts).bool()


def route_v3(m: ModelSpec, h, w_gate, bias):
    """h (N, H) -> (fp32 weights (N, k), expert ids (N, k)): DeepseekV3TopkRouter. The choice
    (the scores plus the bias, the groups, the top-k) is made without autograd: only the chosen
    scores carry a gradient, so nothing the choice computes needs keeping for the backward."""
    scores = F.linear(h.to(torch.float32), w_gate.to(torch.float32)).sigmoid()      # (N, E)
    with torch.no_grad():
        choice = scores + bias
        if m.expert_groups:
            G = m.expert_groups
            best2 = choice.view(-1, G, m.n_experts // G).topk(2, dim=-1)[0].sum(dim=-1)  # (N, G)
            choice = choice.masked_fill(~_group_mask(m, choice, best2), float("-inf"))
        idx = torch.topk(choice, k=m.experts_per_token, dim=-1, sorted=False)[1]
        del choice
    top = scores.gather(1, idx)
    if m.norm_topk_prob:
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
    return top * m.routed_scaling, idx


def route_v2(m: ModelSpec, h, w_gate):
    """h (N, H) -> (fp32 weights (N, k), expert ids (N, k)): DeepseekV2TopkRouter. The choice is
    made without autograd and the chosen probabilities gathered, the values its top-k gives."""
    scores = F.linear(h.to(torch.float32), w_gate.to(torch.float32)).softmax(dim=-1, dtype=torch.float32)
    with torch.no_grad():
        choice = scores
        if m.expert_groups:
            G = m.expert_groups
            best = scores.view(-1, G, m.n_experts // G).max(dim=-1).values
            choice = scores.masked_fill(~_group_mask(m, scores, best), 0.0)
        idx = torch.topk(choice, k=m.experts_per_token, dim=-1, sorted=False)[1]
        del choice
    return scores.gather(1, idx) * m.routed_scaling, idx


def deepseek_moe(m: ModelSpec, w, h):
    """h (B, T, H) normed -> the MoE MLP's output (B, T, H), before the residual."""
    shape = h.shape
    flat = h.reshape(-1, shape[-1])
    if family(m.family).moe.scoring == "sigmoid":  # V3
        top, idx = route_v3(m, flat, w["mlp.gate.weight"], w["mlp.gate.e_score_correction_bias"])
    else:
        top, idx = route_v2(m, flat, w["mlp.gate.weight"])
    rows, _ = expert_rows(idx, m.n_experts)
    out = routed_experts(w, flat, top, rows).view(shape)
    del top, idx, rows, _  # the routing's leftovers, before the shared experts run
    return out + swiglu_mlp(w, h, prefix="mlp.shared_experts.")
