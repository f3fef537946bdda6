"""gpt-oss's MoE MLP as a plain function of named weights: transformers 5's eager GptOssMLP, kernel
for kernel in the forward, so fp32 results match it to rounding.

- router: logits = h . W^T + b (mlp.router), top-k of the logits, a softmax over those k in the
  logits' dtype (GptOssTopKRouter);
- experts: for each expert that got tokens, in ascending expert order, its rows gathered,
  x . gate_up_proj[e] then + bias (the stack is stored (E, in, out): the product is x . W, not
  x . W^T; the bias added after the product, not fused into it, rounds as transformers does),
  gate the even columns and up the odd ones, the clamped SwiGLU (ClampedSwiGLU), . down_proj[e] +
  bias, times the routing weight, index_add_ into a zero output (GptOssExperts' loop).

With the load-balancing loss on (router_aux_loss_coef > 0) the router also hands a softmax of all
E logits in fp32 and its top-k counts to a RouterStats (router_aux.py), as transformers'
load_balancing_loss_func takes them from the router logits.

ClampedSwiGLU is one autograd function where transformers runs seven autograd ops: it keeps its
input (the 2I-wide gate|up rows) alone, where autograd would keep six I-wide tensors besides
(the clamps' inputs, the sigmoid, its product, up + 1, the gate), and recomputes the rest in its
backward. Its forward runs transformers' ops in transformers' order and dtype, so its output is
the same to the bit; its backward is the same function's derivative."""
import torch
import torch.nn.functional as F

from horizon_exec.model.adapters import adapt_rows, expert_adapters
from horizon_exec.model.moe_block import expert_rows
from horizon_sim.schedule.expert_load import BF16_ROW_MULTIPLE
from horizon_sim.specs.model import ModelSpec


class ClampedSwiGLU(torch.autograd.Function):
    """gate_up (N, 2I), gate the even columns and up the odd -> (N, I):
    (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = clamp(gate, max=limit)."""

    @staticmethod
    def forward(ctx, gate_up, alpha: float, limit: float):
        ctx.save_for_backward(gate_up)
        ctx.args = alpha, limit
        g = gate_up[..., ::2].clamp(max=limit)
        glu = (g * alpha).sigmoid_()
        glu = torch.mul(g, glu, out=glu)              # g * sigmoid(alpha g), transformers' operand order
        del g                                         # before up's clamp: at most 2I beside the input
        u = gate_up[..., 1::2].clamp(min=-limit, max=limit).add_(1)
        return u.mul_(glu)                            # (up + 1) * glu

    @staticmethod
    def backward(ctx, dy):
        (gate_up,) = ctx.saved_tensors
        alpha, limit = ctx.args
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        d = torch.empty_like(gate_up)
        d_gate, d_up = d[..., ::2], d[..., 1::2]
        g = gate.clamp(max=limit)
        s = (g * alpha).sigmoid_()
        torch.mul(g, s, out=d_up)                     # glu: d out / d u
        # d glu / d g = s + alpha g s (1 - s) = s (1 + alpha g (1 - s))
        torch.sub(1.0, s, out=d_gate).mul_(g).mul_(alpha).add_(1.0).mul_(s)
        del g, s
        d_gate.mul_(up.clamp(min=-limit, max=limit).add_(1)).mul_(dy)
        d_gate.masked_fill_(gate > limit, 0.0)        # the clamp passes no gradient above its limit
        d_up.mul_(dy).masked_fill_(up.abs() > limit, 0.0)
        return d, None, None


def route(m: ModelSpec, h, w_router, b_router, want_probs: bool):
    """h (N, H) -> (weights (N, k) in h's dtype, expert ids (N, k), fp32 probabilities (N, E) when
    want_probs (the load-balancing loss), else None); transformers' GptOssTopKRouter."""
    logits = F.linear(h, w_router, b_router)                           # (N, E)
    top, idx = torch.topk(logits, m.experts_per_token, dim=-1)
    weights = F.softmax(top, dim=1, dtype=top.dtype)
    probs = F.softmax(logits, dim=-1, dtype=torch.float32) if want_probs else None
    return weights, idx, probs


def gpt_oss_mlp(m: ModelSpec, w, h, router=None):
    """h (B, T, H) normed -> gpt-oss's MoE MLP output (B, T, H), before the residual. router: a
    RouterStats (router_aux.py), or None."""
    shape = h.shape
    h = h.reshape(-1, shape[-1])                                        # (N, H)
    top, idx, probs = route(m, h, w["mlp.router.weight"], w["mlp.router.bias"], router is not None)
    out = torch.zeros_like(h)
    rows, per_expert = expert_rows(idx, m.n_experts)
    if router is not None:
        router.seen(probs, per_expert)
    del probs
    if rows:
        gate_up, gate_up_b = w["mlp.experts.gate_up_proj"].unbind(0), w["mlp.experts.gate_up_proj_bias"].unbind(0)
        down, down_b = w["mlp.experts.down_proj"].unbind(0), w["mlp.experts.down_proj_bias"].unbind(0)
        lora_gu, lora_down = expert_adapters(w, "mlp.experts.gate_up_proj"), expert_adapters(w, "mlp.experts.down_proj")
    # on a bf16 CPU, rows padded to an AMX tile's multiple: moe_block.py says why
    multiple = BF16_ROW_MULTIPLE if h.device.type == "cpu" and h.dtype == torch.bfloat16 else 1
    alpha, limit = float(m.swiglu_alpha), float(m.swiglu_limit)
    for e, slot, tok in rows:
        c = tok.numel()
        x = h[tok] if c % multiple == 0 else F.pad(h[tok], (0, 0, 0, -c % multiple))
        # the product, then its bias added (in place: the same rounding as transformers' `x @ W + b`)
        act = ClampedSwiGLU.apply(adapt_rows(w, lora_gu, e, x, torch.mm(x, gate_up[e]).add_(gate_up_b[e])), alpha, limit)
        y = adapt_rows(w, lora_down, e, act, torch.mm(act, down[e]).add_(down_b[e]))[:c] * top[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
        del x, act, y  # before the next expert's rows are gathered
    return out.reshape(shape)
