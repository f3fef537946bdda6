"""The work of one compute op of the executor's layer template, counted tensor by tensor: the
GEMMs it runs (with their shapes), its attention, the bytes its elementwise kernels move, and
the temporaries it holds at its peak. The builder puts the totals on each op (hbm_bytes,
workspace_bytes); the cost model reads the GEMM shapes and attention from here.

The template (horizon_exec/model/layers.py, head.py) is a Llama-style block: RMSNorm with fp32
statistics, q/k/v projections, RoPE (rotate_half), causal SDPA with grouped kv heads, o
projection, residual, RMSNorm, SwiGLU MLP, residual. Backward is forward-with-grad of one
block followed by autograd.grad. The head is a final RMSNorm, then per chunk of c tokens
fp32 logits, logsumexp and the softmax gradient in place, and three GEMMs.

The block's kernels are its description's (specs/block.py: projections, norms, RoPE, attention,
activation, residual adds); what each kind of kernel reads, writes and keeps per element is in
kernel_bytes.py. This module adds them up per op and finds the temporaries' peak at the
template's points. Every figure was checked against a dispatch-level count of the template's
kernels (tests/test_calibrate.py), and each temporary-peak formula against the executor's
measured temp_peak_bytes; nothing here is fitted.
"""
from dataclasses import dataclass

from horizon_sim.schedule import kernel_bytes
from horizon_sim.schedule.expert_load import expert_rows, max_rows, min_rows, padded_rows, row_multiple
from horizon_sim.specs import block
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.families import family

LAYOUTS = ("nt", "nn", "tn")
WORKSPACE_ONSET = 0.25
"""How far into a compute op its temporaries reach their peak, at the earliest, as a fraction
of the op's duration: a backward's peak comes after its forward-with-grad (about a third of
the op), a forward's at its MLP (past half). The memory model charges Op.workspace_bytes from
this point on; charging it from the op's start would add a gradient that is still being
offloaded when the op starts, which the executor has long freed when its peak comes."""


@dataclass(frozen=True, slots=True)
class Gemm:
    """C (m x n) = A (m x k) . B (k x n); layout 'nt' (x . W^T), 'nn' (dY . W), 'tn' (X^T . dY),
    run `count` times (the loss chunks of one shape: one entry, however many chunks)."""
    layout: str
    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        """FLOPs of all `count` calls."""
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True, slots=True)
class Attention:
    """Nominal attention FLOPs of one op: forward 2 x 2 T^2 hd per head and sequence, halved
    for a causal kernel (it skips masked tiles); backward (the gradient kernels alone) twice
    the forward. Under an explicit mask (masked=True) the kernel computes every score."""
    seq: int
    head_dim: int
    fwd_flops: float
    bwd_flops: float


def linears(m: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) features of the block's projections, in the order the template runs them
    (specs/block.py)."""
    return [(p.in_features, p.out_features) for p in block.projections(m)]


def _rows(m: ModelSpec, p: block.Projection, tokens: int) -> tuple[tuple[int, int], ...]:
    """(rows, count) of a projection's GEMMs: every token once, or stacked experts looped one
    GEMM per expert over the rows routed to it (schedule/expert_load.py)."""
    return expert_rows(tokens, m.experts_per_token, p.experts) if p.experts else ((tokens, 1),)


def block_gemms(m: ModelSpec, tokens: int, backward: bool) -> list[Gemm]:
    """Forward: x . W^T per projection. Backward: the forward again (with grad), then per
    projection the input gradient dY . W and the weight gradient X^T . dY. An MoE block's
    experts: per expert, over its routed rows (count: the experts of one row count)."""
    ps = block.projections(m)
    out = [Gemm("nt", r, p.out_features, p.in_features, c) for p in ps for r, c in _rows(m, p, tokens)]
    if backward:
        out += block_gemms_saved_backward(m, tokens)
    return out


def block_gemms_saved_backward(m: ModelSpec, tokens: int) -> list[Gemm]:
    """A backward from autograd's saved tensors (BACKWARD_SAVED): per projection the input and
    weight gradients only; the forward ran once, in FORWARD, with the graph kept."""
    out = []
    for p in block.projections(m):
        i, o = p.in_features, p.out_features
        for r, c in _rows(m, p, tokens):
            out += [Gemm("nn", r, i, o, c), Gemm("tn", i, o, r, c)]
    return out


def head_chunks(tokens: int, chunk_tokens: int) -> int:
    return -(-tokens // max(1, min(chunk_tokens, tokens)))


def head_gemms(m: ModelSpec, tokens: int, chunk_tokens: int, backward: bool = True) -> list[Gemm]:
    """Per chunk of c tokens: logits h . W^T, and with backward dh = g . W, dW += g^T . h. The
    full chunks share one shape and are one entry with a count, and the shorter last chunk
    another, so the work of costing the head does not grow with the batch (tokens / c chunks)."""
    c = min(chunk_tokens, tokens)
    full, rest = divmod(tokens, c)
    out = []
    for n, count in ((c, full), (rest, 1)):
        if n and count:
            out.append(Gemm("nt", n, m.vocab, m.hidden, count))
            if backward:
                out += [Gemm("nn", n, m.hidden, m.vocab, count), Gemm("tn", m.vocab, m.hidden, n, count)]
    return out


def masked_attention(m: ModelSpec, layer: int, seq: int, doc_masks: bool) -> bool:
    """Block `layer` runs SDPA under an explicit mask (layers.attention_mask): a sliding window
    shorter than the sequence, or document masks. Flash-style kernels then compute every T x T
    score (no causal tile skipping), and the mask itself is a temporary."""
    return doc_masks or 0 < m.window(layer) < seq


def attention(m: ModelSpec, micro_batch: int, seq: int, backward: bool, masked: bool = False) -> Attention:
    fwd = 2.0 * micro_batch * seq * seq * m.q_dim * (2 if masked else 1)  # 4 T^2 q per sequence, causal: half
    return Attention(seq, m.hd, fwd, 2.0 * fwd if backward else 0.0)


def mask_bytes(micro_batch: int, seq: int, doc_masks: bool) -> int:
    """The bool attention mask of one block call: (T, T), or (micro_batch, T, T) per document."""
    return (micro_batch if doc_masks else 1) * seq * seq


# ---- elementwise traffic ------------------------------------------------------------------
def block_elementwise_bytes(m: ModelSpec, tokens: int, seq: int, a: int, backward: bool) -> int:
    """Bytes the block's non-GEMM, non-attention kernels read plus write (N = tokens): each
    kernel of the block's description (specs/block.py) at its kind's rate (kernel_bytes.py); a
    backward runs the forward again (with grad) before its own kernels."""
    total = 0
    for k in block.kernels(m):
        per_pass = kernel_bytes.per_pass_bytes(k, seq, m.hd, a)
        total += tokens * kernel_bytes.forward_bytes(k, a) + per_pass
        if backward:
            total += tokens * kernel_bytes.backward_bytes(k, a) + per_pass
    return int(total)


def head_logits_bytes(m: ModelSpec, tokens: int, a: int, loss_kernel: str = "torch", backward: bool = True) -> int:
    """The loss's traffic over the logits: 'torch': the fp32 pipeline (cast, logsumexp,
    subtract, exp, scale, cast back: 28 + casts bytes per logit); 'fused': each row read
    twice (max, sum of exponentials) and, with the backward, read and written once more."""
    if loss_kernel == "fused":
        return int(tokens * m.vocab * a * (4 if backward else 2))
    return int(tokens * m.vocab * (28 + kernel_bytes.casts(a)))


def head_loss_elementwise_bytes(m: ModelSpec, tokens: int, a: int, loss_kernel: str = "torch") -> int:
    """Forward only (HEAD_LOSS): the final norm and the logits pipeline."""
    return int(tokens * kernel_bytes.norm_forward(m.hidden, 1, a)
               + head_logits_bytes(m, tokens, a, loss_kernel, backward=False))


def head_elementwise_bytes(m: ModelSpec, tokens: int, a: int, loss_kernel: str = "torch") -> int:
    """Final norm forward and backward, the logits pipeline (head_logits_bytes), and zeroing the
    LM head's gradient."""
    H, V = m.hidden, m.vocab
    return int(tokens * (kernel_bytes.norm_forward(H, 1, a) + kernel_bytes.norm_backward(H, 1, a))
               + head_logits_bytes(m, tokens, a, loss_kernel) + 2 * V * H * a)


# ---- temporaries --------------------------------------------------------------------------
def _parts(m: ModelSpec) -> dict:
    """The block's description split at its halves: per half its kernels, its first norm (the
    one reading the half's input), and the projections' weights; attention's kernel; the
    MLP's activation."""
    ks = block.kernels(m)
    half = {p: [k for k in ks if k.part == p] for p in block.PARTS}
    mlp = [p for p in block.projections(m) if p.module.startswith("mlp.")]
    mlp_weights = sum(p.params for p in mlp)
    return dict(half=half, norm={p: next(k for k in half[p] if k.kind == "rmsnorm") for p in block.PARTS},
                attention=next(k for k in ks if k.kind == "attention"),
                act=next(k for k in half["mlp"] if k.kind in ("swiglu", "silu")),
                mlp_weights=mlp_weights,
                # the gradient of the MLP's last projection (dense: down's H x F, its bias too), the
                # first its backward makes
                last_weight=mlp[-1].params)


def block_temp_peak_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int, backward: bool,
                          mask: int = 0) -> int:
    """Peak bytes of the op's device temporaries, as the executor measures them (every fresh
    aten allocation of the op, its output included, until freed), the largest of a few
    points of the template. What each kernel keeps is its kind's (kernel_bytes.py); the
    points are the template's:

    Forward (no autograd), the larger of: at the MLP's activation, the residual x1, the MLP
    norm's output, and the activation's inputs and outputs (gate, up, silu(gate), the product;
    the attention half's tensors were freed when it returned); at the attention call, the first
    norm's output and what attention holds (q, k, v, o and the fp32 logsumexp), with an explicit
    mask's bool and additive forms.

    Backward (forward with grad, then autograd.grad). Autograd keeps what each kernel saves
    (per norm its fp32 input, in fp32 the first norm's is x itself, the cast back, the output
    a projection reads and 4 bytes of rsqrt per row; q, k, v, o and the attention's fp32
    logsumexp; the activation's tensors; an MoE block's router, routed rows and shared
    expert's, kernel_bytes.py), and the output y (aH) is alive. The peak is then one of
      - at the forward-with-grad's last add: everything saved, the residual x1 (in fp32 the
        MLP norm's saved input already), the MLP's output (an MoE block's: the zero tensor its experts' rows were added into and, with a
        shared expert, its gated output) and their sum (3 or 4 aH);
      - in the MLP's backward: the activation's gradients and the last projection's weight
        gradient (H x F); an MoE block's experts instead, at either end of their loop
        (_expert_loop_bytes);
      - in the MLP norm's backward: the MLP's weight gradients, its fp32 input and five
        fp32 temporaries (20 per element), with what the attention half saved;
      - in the first norm's backward: every weight gradient of the block (autograd.grad
        returns them together), its fp32 input and five temporaries, y and dh.

    An explicit mask (`mask` = its elements M, mask_bytes; 0 when causal) adds: in the forward,
    at the attention call, the bool mask (M) and the additive mask SDPA makes of it in the
    compute dtype (aM) next to the first norm's output and what attention keeps (q, k, v, o,
    the fp32 logsumexp); in the backward, aM while autograd keeps the additive mask (until the
    attention's backward), and the same attention point during the forward-with-grad.
    """
    H, N = m.hidden, micro_batch * seq
    parts = _parts(m)
    att, act = parts["attention"], parts["act"]
    if not backward:
        p_attn = N * (a * H + kernel_bytes.saved_bytes(att, a)) + mask * (1 + a)
        return max(N * (a * H + a * parts["norm"]["mlp"].width + kernel_bytes.live_in_forward_bytes(act, a)), p_attn)
    saved = {p: sum(kernel_bytes.saved_bytes(k, a) for k in parts["half"][p]) for p in block.PARTS}
    norm1, norm2 = parts["norm"]["attention"], parts["norm"]["mlp"]
    gates = sum(k.kind == "gate_mul" for k in parts["half"]["mlp"])
    x1 = a * H if a != 4 else 0  # in fp32 the MLP norm's saved fp32 input is x1 itself
    p_end = N * (saved["attention"] + saved["mlp"] + x1 + (2 + gates) * a * H) + a * mask
    if m.n_experts:
        p_end += expert_padding_bytes(m, a, parts)
        p_mlp = _expert_loop_bytes(m, N, a, saved, parts) + a * mask
    else:
        p_mlp = (N * (saved["attention"] + saved["mlp"] + kernel_bytes.backward_gradients_bytes(act, a) + a * H)
                 + parts["last_weight"] * a + a * mask)
    p_norm2 = (N * (saved["attention"] + kernel_bytes.fp32_input_bytes(norm2, a) + 20 * norm2.width + a * H)
               + (parts["mlp_weights"] + norm2.weight) * a + a * mask)  # + its weight's grad
    p_norm1 = N * (kernel_bytes.fp32_input_bytes(norm1, a) + 20 * norm1.width + 2 * a * H) + m.layer_params * a
    p_attn = N * saved["attention"] + mask * (1 + a) if mask else 0
    return int(max(p_end, p_mlp, p_norm2, p_norm1, p_attn))


def _routed_row_bytes(m: ModelSpec, a: int, parts: dict) -> float:
    """What the routed kernels save per routed row (a token's k rows share its per-token figure)."""
    return sum(kernel_bytes.saved_bytes(kk, a) for kk in parts["half"]["mlp"] if kk.routed) / m.experts_per_token


def expert_padding_bytes(m: ModelSpec, a: int, parts: dict | None = None) -> int:
    """The most the experts' padded rows add to what the forward saves (expert_load.row_multiple):
    every expert one row short of a multiple (0 for a dense block)."""
    if not m.n_experts:
        return 0
    parts = parts or _parts(m)
    return int(m.n_experts * (row_multiple(a) - 1) * _routed_row_bytes(m, a, parts))


def _expert_loop_bytes(m: ModelSpec, N: int, a: int, saved: dict, parts: dict) -> int:
    """The peak of an MoE block's expert loop in the backward (horizon_exec/model/moe_block.py).
    It runs expert by expert, the last first. Each expert's combine backward gathers dy for its
    rows and forms the down output's and the routing weight's gradients (2 aH a row; with fp32
    routing weights, specs/moe.py, dy's rows cast to fp32 and their fp32 product besides, 8H);
    its SwiGLU's backward holds, beside the down output's gradient, the product's, up's and
    gate's gradients (aH + 3 aI a row) and down's weight gradient (H I); its weight gradients
    (3 I H) are made and what it saved (the routed kernels', kernel_bytes.py) is freed; then its gathered rows' gradient is scattered into a zero (N, H) tensor, with
    index_put's result another, and added to the running dh. Live throughout: what the
    forward saved, y, the running sum of the routing weights' gradient (N, k; fp32 at most:
    4k) and, with a shared expert, its pending gradient (aH a gate). The peak is one of
      - the first expert's combine or SwiGLU backward, at the most loaded expert's rows
        (expert_load.max_rows);
      - the first or the second expert's add (the first has no running dh to add to unless
        a shared expert gave one), where the least loaded experts' rows (expert_load.min_rows)
        have been freed: what is live moves linearly from expert to expert, so these and
      - the last expert's add (every routed row freed, every expert's weight gradient), and
      - the stack after the loop, where the unbound experts' gradients are assembled into the
        (E, ...) gradients (the unbind's backward): one stacked tensor live while the other's
        per-expert pieces are (the largest counted twice), beside y and dh,
    bound it."""
    H, I, k, E = m.hidden, m.expert_ffn_hidden, m.experts_per_token, m.n_experts
    aH = a * H
    gates = sum(kk.kind == "gate_mul" for kk in parts["half"]["mlp"])
    experts = [p.weight_params for p in block.projections(m) if p.experts]
    routed = sum(kernel_bytes.saved_bytes(kk, a) for kk in parts["half"]["mlp"] if kk.routed)  # per token
    per_row, cold = _routed_row_bytes(m, a, parts), min_rows(N, k, E)
    base = N * (saved["attention"] + saved["mlp"] + 4 * k + (1 + gates) * aH) + expert_padding_bytes(m, a, parts)
    hot = padded_rows(max_rows(N, k, E), a)
    fp32_weights = 8 * H if family(m.family).moe.fp32_routing_weights and a != 4 else 0
    combine = base + (2 * aH + fp32_weights) * hot
    swiglu = base + (aH + 3 * a * I) * hot + a * H * I
    adds = [base + N * aH * (2 + (1 if j > 1 or gates else 0)) + j * (3 * I * H * a - cold * per_row)
            for j in (1, 2)]
    last = base - N * routed + 3 * N * aH + sum(experts) * a
    stack = base - N * routed + N * aH + (sum(experts) + max(experts)) * a
    return int(max(combine, swiglu, *adds, last, stack))


def block_saved_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int) -> int:
    """What autograd keeps from a block's forward for its backward when the graph persists (no
    recompute): what each kernel saves (kernel_bytes.saved_bytes) and the block's output,
    which the next block saves as its input."""
    per_token = sum(kernel_bytes.saved_bytes(k, a) for k in block.kernels(m)) + a * m.hidden
    return int(micro_batch * seq * per_token)


def head_temp_peak_bytes(m: ModelSpec, tokens: int, chunk_tokens: int, a: int, loss_kernel: str = "torch") -> int:
    """The head's peak (horizon_exec/model/head.py, xent.py), the larger of two moments:
    inside a chunk, with the normed rows and dh (N x H), the norm's saved fp32 input and cast
    and 4 bytes of rsqrt per token:
    - loss_kernel 'torch': the chunk's fp32 logits (c x V) next to logsumexp's fp32 x - max (8 B
      a logit; issue 30: uncounted, a 131k vocabulary in fp32 peaked 35% above admission) with
      the target ids and mask (9 B a row); or, later, the fp32 logits beside their gradient in
      the compute dtype (the same tensor in fp32) with the per-row scalars (target id,
      logsumexp, target logit, mask: 17 B a row). The GEMM's own output (compute dtype) is
      freed as soon as it is widened. A chunk's scalars are gone before the next chunk
      starts (they live in xent.py's call);
    - 'fused': the chunk's logits in the compute dtype (overwritten by their gradient), their
      per-row fp32 losses and the losses' sum;
    or, with a small vocabulary, in the norm's backward (its fp32 input, five fp32
    temporaries, the normed rows and dh)."""
    H, V = m.hidden, m.vocab
    c = min(chunk_tokens, tokens)
    in32 = 4 * H if a != 4 else 0
    loss = 4  # the fp32 loss accumulator
    if loss_kernel == "fused":
        chunk = c * V * a + 4 * c + 4
    else:
        chunk = max(c * V * 8 + c * 9, c * V * (4 + (a if a != 4 else 0)) + c * (8 + 4 + 4 + 1))
    logits = chunk + tokens * (in32 + 3 * a * H + 4) + loss
    norm_bwd = tokens * (in32 + 20 * H + 2 * a * H) + H * a + loss  # + the norm weight's grad
    return int(max(logits, norm_bwd))


def block_workspace_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int, backward: bool,
                          attention: str = "flash", mask: int = 0) -> int:
    """Op.workspace_bytes: the temporary peak less the output the op hands over as a schedule
    buffer (y, or dx), which the simulator already charges from the op's start. Eager
    attention adds the T x T scores and probabilities per head it keeps for backward."""
    ws = block_temp_peak_bytes(m, micro_batch, seq, a, backward, mask) - micro_batch * seq * m.hidden * a
    if backward and attention == "eager":
        ws += 2 * micro_batch * m.n_heads * seq * seq * a
    return ws


def head_workspace_bytes(m: ModelSpec, tokens: int, chunk_tokens: int, a: int, loss_kernel: str = "torch") -> int:
    return head_temp_peak_bytes(m, tokens, chunk_tokens, a, loss_kernel) - tokens * m.hidden * a


def head_loss_workspace_bytes(m: ModelSpec, tokens: int, chunk_tokens: int, a: int,
                              loss_kernel: str = "torch") -> int:
    """Peak bytes of HEAD_LOSS's temporaries (its input is a schedule buffer, its output a
    scalar): the normed rows (N x H) next to either the norm's fp32 internals (its input and
    rsqrt) or one loss chunk: 'torch': its logits in the compute dtype and fp32 with
    logsumexp's fp32 temporary and per-row scalars; 'fused': its logits and per-row losses."""
    H, V = m.hidden, m.vocab
    c = min(chunk_tokens, tokens)
    chunk = c * V * a + 4 * c + 4 if loss_kernel == "fused" else c * V * (a + 8) + c * 24
    return int(tokens * H * a + max(tokens * H * 8 + tokens * 8, chunk) + 8)
