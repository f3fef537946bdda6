"""The MLP half of a mixture-of-experts block (specs/moe.py: qwen3_moe, mixtral, qwen2_moe), as a
plain function of named weights: transformers 5's eager path, kernel for kernel, so fp32
results match it to rounding.

- router: logits = h . W_gate^T, a softmax over all E in fp32, top-k of the probabilities,
  (norm_topk_prob, always for Mixtral) the k weights divided by their sum; Qwen's routers cast
  the weights back to the activation dtype, Mixtral's keep them in fp32 (the product with an
  expert's output then promotes, and is cast back before the sum, as transformers does);
- experts: for each expert that got tokens, in ascending expert order, its rows gathered,
  gate_up_proj[e] (gate the first I rows, up the last I), SiLU(gate) * up, down_proj[e],
  times the routing weight, index_add_ into a zero output: each token's k contributions are
  summed in expert order, as transformers' loop sums them;
- Qwen2-MoE: a dense SwiGLU shared expert, scaled per token by sigmoid(h . w_shared_gate),
  added to the experts' sum.

With the router load-balancing loss on (router_aux_loss_coef > 0), moe_mlp hands what the
router saw (its probabilities' per-expert sums and its top-k counts) to a RouterStats
(router_aux.py), the engine's way to a loss that spans every layer.

On a CPU computing in bf16, each expert's rows are padded with zero rows to a multiple of
BF16_ROW_MULTIPLE (16, an AMX tile's rows) before its GEMMs and cut after: oneDNN builds and
caches a kernel per GEMM shape there, and the rows an expert gets change every step, so unpadded
every step compiled new kernels, ran 1.4-1.8x slower than its rows cost and grew the process by
~100 MB a step (validate's moe configuration on a 2-core AMX VM: 450-640 ms steps and 1.3 GB RSS
after 12 steps; padded 290-420 ms and 0.64 GB, flat). A zero row adds nothing to another row's
result or to a weight gradient. The padding costs at most 15 rows per expert: its GEMM time is
not priced, its temporaries are (as the most padding, horizon_sim/schedule/expert_load.py).

Differences from transformers that change no result: the per-expert row lists come from one
stable sort of the (slot, token) choices (one device sync for the counts) rather than a one-hot
mask of N x k x (E + 1) integers, in the same order torch.where gives them; and the 3-D expert
tensors are unbound once, so their gradient is assembled once (a select per expert would make a
full E-expert zero tensor per expert in the backward).
"""
import torch
import torch.nn.functional as F

from horizon_exec.model.adapters import adapt_rows, expert_adapters, linear
from horizon_sim.schedule.expert_load import BF16_ROW_MULTIPLE
from horizon_sim.specs.families import family
from horizon_sim.specs.model import ModelSpec


def route(m: ModelSpec, h, w_gate):
    """h (N, H) -> (weights (N, k), expert ids (N, k), probabilities (N, E) fp32);
    transformers' TopKRouter."""
    logits = F.linear(h, w_gate)                                        # (N, E)
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    top, idx = torch.topk(probs, m.experts_per_token, dim=-1)           # (N, k)
    if m.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    if not family(m.family).moe.fp32_routing_weights:  # Mixtral's router returns its weights in fp32
        top = top.to(logits.dtype)
    return top, idx, probs


def expert_rows(idx, n_experts: int):
    """idx (N, k) expert ids -> ([(expert, slot positions, token rows)] for the experts that got
    rows, ascending, each expert's rows ordered by (slot, token), torch.where's order on
    transformers' one-hot mask; the rows per expert (E,) int64 on idx's device)."""
    N, k = idx.shape
    flat = idx.t().reshape(-1)                                          # j = slot * N + token
    order = torch.sort(flat, stable=True).indices
    per_expert = torch.bincount(flat, minlength=n_experts)
    counts = per_expert.tolist()                                        # the one sync
    out, start = [], 0
    for e, c in enumerate(counts):
        if c:
            j = order[start:start + c]
            out.append((e, j // N, j % N))
            start += c
    return out, per_expert


def moe_mlp(m: ModelSpec, w, h, router=None):
    """h (B, T, H) normed -> the MoE MLP's output (B, T, H), before the residual. router: a
    RouterStats (router_aux.py) that receives the router's probabilities and counts, or None."""
    shape = h.shape
    h = h.reshape(-1, shape[-1])                                        # (N, H)
    shared = None
    if m.shared_expert_ffn_hidden:  # transformers runs the shared expert first
        g = linear(h, w, "mlp.shared_expert.gate_proj")
        u = linear(h, w, "mlp.shared_expert.up_proj")
        shared = linear(F.silu(g) * u, w, "mlp.shared_expert.down_proj")
        del g, u  # before the routed experts run (the planner's forward bound holds the shared output alone)
    top, idx, probs = route(m, h, w["mlp.gate.weight"])
    rows, per_expert = expert_rows(idx, m.n_experts)
    if router is not None:
        router.seen(probs, per_expert)
    del probs
    out = routed_experts(w, h, top, rows)
    if shared is not None:
        out = out + torch.sigmoid(linear(h, w, "mlp.shared_expert_gate")) * shared
    return out.reshape(shape)


def routed_experts(w, h, top, rows):
    """h (N, H) -> the routed experts' weighted sum (N, H): for each expert with rows (expert_rows),
    its rows gathered, gate_up_proj[e] (gate the first I rows, up the last I), SiLU(gate) * up,
    down_proj[e], times the routing weight (top (N, k): an fp32 weight promotes the product,
    cast back before the sum), index_add_ into a zero output in expert order."""
    out = torch.zeros_like(h)
    if rows:
        gate_up = w["mlp.experts.gate_up_proj"].unbind(0)               # (2I, H) each
        down = w["mlp.experts.down_proj"].unbind(0)                     # (H, I) each
        lora_gu, lora_down = expert_adapters(w, "mlp.experts.gate_up_proj"), expert_adapters(w, "mlp.experts.down_proj")
    multiple = BF16_ROW_MULTIPLE if h.device.type == "cpu" and h.dtype == torch.bfloat16 else 1
    for e, slot, tok in rows:
        c = tok.numel()
        x = h[tok] if c % multiple == 0 else F.pad(h[tok], (0, 0, 0, -c % multiple))
        g, u = adapt_rows(w, lora_gu, e, x, F.linear(x, gate_up[e])).chunk(2, dim=-1)
        y = _down(w, lora_down, e, F.silu(g) * u, down[e])[:c] * top[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
        del x, g, u, y  # before the next expert's rows are gathered (the planner's forward bound counts one)
    return out


def _down(w, lora, e: int, act, weight):
    """Expert e's down projection of its activation, adapted when `lora` holds its stack's
    adapters; the activation is freed on return, before the routing weight's product (the
    planner's forward peak holds one of the two)."""
    return adapt_rows(w, lora, e, act, F.linear(act, weight))
