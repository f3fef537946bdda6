"""The work of one compute op of the executor's block, counted tensor by tensor: the GEMMs it
runs (with their shapes), its attention, the bytes its elementwise kernels move, and the
temporaries it holds at its peak. The builder puts the totals on each op (hbm_bytes,
workspace_bytes); the cost model reads the GEMM shapes and attention from here.

The block is its family's description (specs/block.py: projections, norms, RoPE, attention,
activation, residual adds, in forward order); what each kind of kernel reads, writes and keeps
per element is in kernel_bytes.py. Backward is forward-with-grad of one block followed by
autograd.grad. The head is a final norm, then per chunk of c tokens fp32 logits, logsumexp and
the softmax gradient in place, and three GEMMs. This module adds the kernels up per op and
finds the temporaries' peak by walking the description's halves (block_temp_peak_bytes). Every
figure is checked against a dispatch-level count of the executor's kernels and its measured
temp_peak_bytes for every family it runs (tests/test_families.py); nothing here is fitted.
"""
from dataclasses import dataclass
from functools import lru_cache

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
    dtype: str = ""
    """'' : the step's compute dtype; else the dtype it runs in (the adapters' fp32 GEMMs)."""

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


def block_gemms(m: ModelSpec, tokens: int, backward: bool, policy=None) -> list[Gemm]:
    """Forward: x . W^T per projection. Backward: the forward again (with grad), then per
    projection the input gradient dY . W and the weight gradient X^T . dY. An MoE block's
    experts: per expert, over its routed rows (count: the experts of one row count). With
    adapters (`policy.lora_rank`): the adapters' GEMMs too, and no weight gradient of the base."""
    ps = block.projections(m)
    out = [Gemm("nt", r, p.out_features, p.in_features, c) for p in ps for r, c in _rows(m, p, tokens)]
    out += adapter_gemms(m, policy, tokens, backward=False)
    if backward:
        out += block_gemms_saved_backward(m, tokens, policy)
    return out


def block_gemms_saved_backward(m: ModelSpec, tokens: int, policy=None) -> list[Gemm]:
    """A backward from autograd's saved tensors (BACKWARD_SAVED): per projection the input and
    weight gradients only (a frozen base: the input gradients, then the adapters' backward);
    the forward ran once, in FORWARD, with the graph kept."""
    frozen = policy is not None and policy.adapters
    out = []
    for p in block.projections(m):
        i, o = p.in_features, p.out_features
        for r, c in _rows(m, p, tokens):
            out += [Gemm("nn", r, i, o, c)] + ([] if frozen else [Gemm("tn", i, o, r, c)])
    return out + adapter_gemms(m, policy, tokens, backward=True)


@lru_cache(maxsize=256)
def adapted(m: ModelSpec, policy) -> tuple[block.Projection, ...]:
    """The block's projections that get a LoRA adapter under `policy` (none without lora_rank),
    in the order its forward runs them: its Linear targets (modules transformers builds as
    nn.Linear, or GPT-2's Conv1D: what peft's target_modules adapts; an MoE router ('mlp.gate')
    is a TopKRouter module in transformers 5 and never gets one), and the routed-expert stacks
    named as peft's target_parameters names them, an adapter per expert."""
    if policy is None or not policy.adapters:
        return ()
    ps = adaptable(m)
    chosen = set(policy.adapter_modules(tuple(p.module for p in ps if not p.experts),
                                        tuple(p.module for p in ps if p.experts)))
    return tuple(p for p in ps if p.module in chosen)


def adaptable(m: ModelSpec) -> list[block.Projection]:
    """The block's projections an adapter may target: all but an MoE block's router."""
    return [p for p in block.projections(m) if not (m.n_experts and p.module in block.ROUTERS)]


def target_name(p: block.Projection) -> str:
    """How lora_targets (and peft) names an adapted projection: a Linear by its last name
    ('q_proj'), an expert stack by its parameter path ('mlp.experts.down_proj')."""
    return p.module if p.experts else p.module.rsplit(".", 1)[-1]


def check_adapter_targets(model: ModelSpec, policy) -> None:
    """HorizonError unless every lora_targets name is a projection of some block of `model`
    (a model with dense blocks first has expert stacks in its MoE blocks only; a name with a
    layer index, of that layer)."""
    if policy is None or not policy.adapters:
        return
    layers = []
    for u in range(model.n_layers):
        ps = adaptable(model.block_spec(u))
        layers.append((tuple(p.module for p in ps if not p.experts), tuple(p.module for p in ps if p.experts)))
    policy.check_targets(layers, family(model.family).layer_prefix)


def layer_policy(model: ModelSpec, policy, layer: int):
    """`policy` as block `layer` of `model` sees it (Policy.at_layer: an expert target naming
    one layer applies there alone); every per-block adapter count asks through it."""
    return policy.at_layer(layer, family(model.family).layer_prefix) if policy is not None else None


def adapter_params(m: ModelSpec, policy) -> int:
    """A block's adapter parameters: A (r x in) and B (out x r) per adapted projection, per
    expert of an adapted stack."""
    return sum(policy.lora_rank * (p.in_features + p.out_features) * max(1, p.experts) for p in adapted(m, policy))


def routed_per_token(m: ModelSpec, p: block.Projection) -> int:
    """Rows a projection runs per token of the block: top-k for a routed-expert stack, else 1."""
    return m.experts_per_token if p.experts else 1


def adapter_gemms(m: ModelSpec, policy, tokens: int, backward: bool) -> list[Gemm]:
    """LoRA's GEMMs per adapted projection, in the adapters' dtype, h = x . A^T (T x r),
    y += s h . B^T. Forward: those two. Backward: dB = dY^T . h, dh = dY . B, dA = dh^T . x, and dh . A into the input's
    gradient (the base's own dY . W is block_gemms_saved_backward's). An expert stack's per
    expert, over its routed rows (_rows)."""
    out = []
    for p in adapted(m, policy):
        i, o, r = p.in_features, p.out_features, policy.lora_rank
        f = ADAPTER_DTYPE
        for t, c in _rows(m, p, tokens):
            out += ([Gemm("tn", o, r, t, c, f), Gemm("nn", t, r, o, c, f), Gemm("tn", r, i, t, c, f),
                     Gemm("nn", t, i, r, c, f)]
                    if backward else [Gemm("nt", t, r, i, c, f), Gemm("nt", t, o, r, c, f)])
    return out


ADAPTER_DTYPE, ADAPTER_BYTES = "fp32", 4
"""The adapters' dtype (fp32, as peft keeps them beside a bf16 base): their path runs in it."""


def adapter_groups(m: ModelSpec, policy) -> list[tuple[int, int, int]]:
    """(input width, adapted projections reading it, rows per token) per input cast of the
    block's adapters: consecutive adapted projections that read their half's normed input share
    one cast (model/adapters.py keeps the latest: q, k and v one, gate and up one); an inner
    projection (the attention's output, the MLP's activation) has its own, and breaks a run
    (Qwen2-MoE's shared-expert gate, after the shared expert's down projection, casts the input
    again); an expert stack casts its own routed rows (top-k per token) and breaks a run too."""
    out: list[list] = []
    run = None
    for p in adapted(m, policy):
        half = "mlp" if p.module.startswith("mlp.") else "attention"
        if p.inner or p.experts:
            out.append([p.in_features, 1, routed_per_token(m, p)])
            run = None
        elif run == half:
            out[-1][1] += 1
        else:
            out.append([p.in_features, 1, 1])
            run = half
    return [(i, k, n) for i, k, n in out]


def adapter_elementwise_bytes(m: ModelSpec, policy, tokens: int, a: int, backward: bool) -> int:
    """What LoRA's own kernels read plus write beyond their rank-r GEMMs (model/adapters.py), N =
    tokens, c = ADAPTER_BYTES, r the rank. Forward: each distinct input cast to the adapters' dtype
    ((a + c) per element; none when a == c), per adapter the rank-r product scaled (2 c r) and
    added into the base's output in place (2 a + c per output element). Backward (its own kernels;
    a BACKWARD runs the forward again before them): per adapter the output's gradient cast for it
    ((a + c) per element) and the scale's (2 c r); per distinct input of k adapters, their input
    gradients summed in fp32 (k - 1 adds of 3 c), cast back (c + a) and added into the input's
    gradient (3 a); with a == c, k adds of 3 a. With dropout (Policy.lora_dropout) each adapter's
    input also gets its mask, 9 c per input element as the kernels' tensors count (allocated, drawn
    in place, scaled by 1 / (1 - p) in place, multiplied in), and in the backward the mask is
    multiplied into its gradient (3 c). Counted kernel by kernel (tests/test_lora_plan.py)."""
    if policy is None or not policy.adapters:
        return 0
    c, r = ADAPTER_BYTES, policy.lora_rank
    cast = a != c
    total = 0
    for p in adapted(m, policy):
        o, n = p.out_features, routed_per_token(m, p)
        total += n * (2 * c * r + (2 * a + c) * o if not backward else 2 * c * r + ((a + c) * o if cast else 0))
        if policy.lora_dropout:  # its mask made and drawn, scaled, applied; backward: applied to the gradient
            total += (9 if not backward else 3) * c * p.in_features
    for i, k, n in adapter_groups(m, policy):
        if not backward:
            total += n * (a + c) * i if cast else 0
        else:
            total += n * (((k - 1) * 3 * c * i + (c + a) * i + 3 * a * i) if cast else k * 3 * a * i)
    return int(total * tokens)


def frozen_backward_bytes(m: ModelSpec, tokens: int, a: int) -> int:
    """What a backward of a frozen block (adapters) does not move that block_elementwise_bytes'
    backward counts: its weights' gradients. An RMSNorm's weight gradient (the product of the
    incoming gradient and the normalised rows, then its sum: 4 a per element); a bias's gradient
    (a read of its projection's output gradient). Counted for the RMSNorm families that multiply
    in the compute dtype; the fp32-weight and (1 + w) norms and LayerNorm keep their figure (an
    estimate: their weight gradients' share of their kernels is not separated)."""
    total = sum(4 * a * k.width for k in block.kernels(m)
                if k.kind == "rmsnorm" and k.weight and not k.fp32_weight and not k.unit_offset)
    total += a * sum(p.out_features for p in block.projections(m) if p.bias and not p.experts)
    return int(total * tokens)


def frozen_saved_bytes(m: ModelSpec, tokens: int, a: int) -> int:
    """What a block's graph does not keep when its weights are frozen (adapters): the inputs its
    projections' weight gradients would read (each half's normed input and the MLP's activation;
    the attention's output stays: the attention's backward keeps it) and the normalised rows each
    RMSNorm keeps for its weight's gradient (a per element; fp32 for Gemma's (1 + w) norm, which
    computes in fp32). A LayerNorm's backward reads its input, mean and rstd either way. Counted
    tensor by tensor (tests/test_lora_plan.py) for every dense family but OLMo-2, whose norms
    multiply their weight in fp32, and the MoE families, whose experts' routed rows are not
    counted: there an estimate (low)."""
    ks = block.kernels(m)
    halves = {"mlp" if p.module.startswith("mlp.") else "attention" for p in block.projections(m) if not p.inner}
    inner = sum(p.in_features for p in block.projections(m) if p.inner and p.module.startswith("mlp.") and not p.experts)
    norms = sum(k.width * (4 if k.unit_offset else a) for k in ks
                if k.kind == "rmsnorm" and k.weight and (k.unit_offset or not k.fp32_weight))
    return int(tokens * (a * (m.hidden * len(halves) + inner) + norms))


def adapter_saved_bytes(m: ModelSpec, policy, tokens: int, a: int) -> int:
    """What a block's graph keeps for its adapters' backward (model/adapters.py): each distinct
    input in the adapters' dtype (dA reads it) and each adapter's scaled rank-r product (dB
    reads it), c = ADAPTER_BYTES per element. Uncast (a == c) the inputs are the tensors
    themselves: a half's normed input once however many read it, and the output projection's
    input is the attention's output, which the attention's backward keeps already. With dropout,
    each adapter keeps its mask and its masked input instead (the cast is kept by neither).
    Counted tensor by tensor (tests/test_lora_plan.py); an expert stack's, per routed row, is
    a count not checked against hooks (the MoE families' saved bytes are an estimate)."""
    if policy is None or not policy.adapters:
        return 0
    c, every = ADAPTER_BYTES, adapted(m, policy)
    ps = [p for p in every if not p.experts]
    # an expert stack's adapters keep each expert's routed rows (their cast, or in fp32 the
    # gathered rows, which the frozen base's product does not keep) and rank-r products
    inputs = sum(m.experts_per_token * (p.in_features + policy.lora_rank) for p in every if p.experts)
    if policy.lora_dropout:  # each adapter's mask (the product's gradient) and masked input (dA's), not the cast
        inputs += 2 * sum(p.in_features for p in ps)
    elif a != c:  # each cast
        inputs += sum(i for i, _, n in adapter_groups(m, policy) if n == 1)
    else:  # the tensors themselves: a half's normed input once, the MLP's inner inputs
        halves = {("mlp" if p.module.startswith("mlp.") else "attention"): p.in_features for p in ps if not p.inner}
        inputs += sum(halves.values()) + sum(p.in_features for p in ps if p.inner and p.module.startswith("mlp."))
    return int(tokens * c * (inputs + policy.lora_rank * len(ps)))


def adapter_workspace_bytes(m: ModelSpec, policy, tokens: int, a: int, backward: bool) -> int:
    """What the adapters add to a block op's temporary peak, at most (a bound, not a walk of the
    block: tests/test_lora_plan.py holds it within 1.3x of the measured peak's total). Forward:
    one input cast (c per element when cast; model/adapters.py keeps the latest) beside one
    adapter's output (c per element) before it is added in, the widest pair. Backward (the
    forward with grad, then autograd.grad): what the graph keeps for the adapters less what the
    frozen base's graph does not keep, and one adapter's gradients in flight (its output
    gradient's cast and its input's fp32 gradient). The frozen base's weight gradients, which
    the full backward's peak holds, are not taken off."""
    if not adapted(m, policy):
        return 0
    n = adapter_in_flight_bytes(m, policy, tokens, with_input=backward or a != ADAPTER_BYTES or policy.lora_dropout > 0)
    if backward:
        n += adapter_saved_bytes(m, policy, tokens, a) - frozen_saved_bytes(m, tokens, a)
    return int(max(0, n))


def adapter_in_flight_bytes(m: ModelSpec, policy, tokens: int, with_input: bool) -> int:
    """One adapter's tensors alive at once, the widest: its output (or output gradient) in the
    adapters' dtype, and with_input its input's cast (or input gradient) beside it, with dropout
    the mask and the masked input too."""
    k = 3 if policy.lora_dropout else 1  # with dropout: the cast, the mask and the masked input
    return int(tokens * ADAPTER_BYTES * max(((k * p.in_features if with_input else 0) + p.out_features
                                             for p in adapted(m, policy)), default=0))


def gemm_flops(gemms: list[Gemm]) -> float:
    return sum(g.flops for g in gemms)


def head_chunks(tokens: int, chunk_tokens: int) -> int:
    return -(-tokens // max(1, min(chunk_tokens, tokens)))


def head_gemms(m: ModelSpec, tokens: int, chunk_tokens: int, backward: bool = True,
               weight_grad: bool = True) -> list[Gemm]:
    """Per chunk of c tokens: logits h . W^T, and with backward dh = g . W, dW += g^T . h
    (weight_grad False, a frozen head: not that one). The
    full chunks share one shape and are one entry with a count, and the shorter last chunk
    another, so the work of costing the head does not grow with the batch (tokens / c chunks)."""
    c = min(chunk_tokens, tokens)
    full, rest = divmod(tokens, c)
    out = []
    for n, count in ((c, full), (rest, 1)):
        if n and count:
            out.append(Gemm("nt", n, m.vocab, m.hidden, count))
            if backward:
                out += [Gemm("nn", n, m.hidden, m.vocab, count)]
                out += [Gemm("tn", m.vocab, m.hidden, n, count)] if weight_grad else []
    return out


def masked_attention(m: ModelSpec, layer: int, seq: int, doc_masks: bool) -> bool:
    """Block `layer` runs SDPA under an explicit mask (layers.attention_mask): a sliding window
    shorter than the sequence, or document masks. Flash-style kernels then compute every T x T
    score (no causal tile skipping), and the mask itself is a temporary. Never with soft-capped
    scores or sinks: that attention masks each chunk of query rows itself, against the keys it sees."""
    if chunked_attention(m):
        return False
    return doc_masks or 0 < m.window(layer) < seq


def chunked_attention(m: ModelSpec) -> bool:
    """m's attention runs in chunks of query rows (horizon_exec/model/softcap_attention.py), not
    SDPA: its scores are soft-capped (Gemma 2) or its heads have sinks (gpt-oss)."""
    return bool(m.attn_softcap) or family(m.family).attention_sinks


def attention(m: ModelSpec, micro_batch: int, seq: int, backward: bool, masked: bool = False) -> Attention:
    fwd = 2.0 * micro_batch * seq * seq * m.q_dim * (2 if masked else 1)  # 4 T^2 q per sequence, causal: half
    return Attention(seq, m.hd, fwd, 2.0 * fwd if backward else 0.0)


def fused_softcap_attention(m: ModelSpec, micro_batch: int, seq: int, backward: bool, window: int = 0) -> Attention:
    """A soft-capped attention run as one fused kernel (flex_attention on a GPU,
    horizon_exec/model/flex_softcap.py), in attention()'s causal count: forward 4 x q_dim per
    (query, key) pair, T^2 / 2 pairs causal, fewer under a sliding window shorter than the
    sequence (the kernel skips the blocks outside it)."""
    w = window if 0 < window < seq else seq
    pairs = (seq * seq - (seq - w) ** 2) / 2
    fwd = 4.0 * micro_batch * m.q_dim * pairs
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
    if backward:  # a half without a pre-norm: its projections read its input, their gradients summed
        for half in _parts(m)["half"].values():
            if half["pre"] is None:
                total += tokens * 3 * a * m.hidden * (half["readers"] - 1)
        # a bias's gradient reads its projection's output gradient once more
        total += tokens * a * sum(p.out_features for p in block.projections(m) if p.bias and not p.experts)
    for k in block.kernels(m):
        total += tokens * kernel_bytes.forward_bytes(k, a) + kernel_bytes.per_pass_bytes(k, seq, m.rope_width, a)
        if backward:
            total += tokens * kernel_bytes.backward_bytes(k, a) + kernel_bytes.per_pass_bytes(k, seq, m.rope_width, a, True)
    return int(total)


def head_logits_bytes(m: ModelSpec, tokens: int, a: int, loss_kernel: str = "torch", backward: bool = True) -> int:
    """The loss's traffic over the logits: 'torch': the fp32 pipeline (cast, logsumexp,
    subtract, exp, scale, cast back: 28 + casts bytes per logit); 'fused': each row read
    twice (max, sum of exponentials) and, with the backward, read and written once more."""
    if loss_kernel == "fused":
        return int(tokens * m.vocab * a * (4 if backward else 2))
    return int(tokens * m.vocab * (28 + kernel_bytes.casts(a)))


def final_norm(m: ModelSpec) -> block.Kernel:
    """The head's norm, the family's kind of norm (the block's norms say which: one multiplying
    its weight in fp32, OLMo-2's, Gemma's (1 + w), or Llama's)."""
    norms = [k for k in block.kernels(m.block_spec(m.n_layers - 1)) if k.kind in block.NORM_KINDS]
    return block.Kernel(norms[0].kind, "head", m.hidden, fp32_weight=any(k.fp32_weight for k in norms),
                        unit_offset=any(k.unit_offset for k in norms))


def head_loss_elementwise_bytes(m: ModelSpec, tokens: int, a: int, loss_kernel: str = "torch") -> int:
    """Forward only (HEAD_LOSS): the final norm and the logits pipeline."""
    return int(tokens * kernel_bytes.forward_bytes(final_norm(m), a)
               + head_logits_bytes(m, tokens, a, loss_kernel, backward=False))


def head_elementwise_bytes(m: ModelSpec, tokens: int, a: int, loss_kernel: str = "torch") -> int:
    """Final norm forward and backward, the logits pipeline (head_logits_bytes), and zeroing the
    LM head's gradient."""
    H, V, k = m.hidden, m.vocab, final_norm(m)
    return int(tokens * (kernel_bytes.forward_bytes(k, a) + kernel_bytes.backward_bytes(k, a))
               + (kernel_bytes.fp32_weight_extra(a)[2] * H if k.fp32_weight else 0)  # its weight's fp32 gradient
               + head_logits_bytes(m, tokens, a, loss_kernel) + 2 * V * H * a)


# ---- temporaries --------------------------------------------------------------------------
def _half(m: ModelSpec, part: str, ks) -> dict:
    """One half of the block as its description gives it: its kernels; its pre-norm (the norm
    whose output its projections read, Kernel.output_saved) and its post-norm (a norm on the
    half's output, right before the residual add: OLMo-2, Gemma 2), each None when absent; its
    body (attention, or the MLP's activation); the weights of its projections and norms, and
    of its last projection (the gradient its backward makes first); the projections that read
    its input or its pre-norm's output (all but the last)."""
    ps = [p for p in block.projections(m) if p.module.startswith("mlp.") == (part == "mlp")]
    pre = next((k for k in ks if k.kind in block.NORM_KINDS and k.output_saved), None)
    post = ks[-2] if len(ks) > 1 and ks[-1].kind == "residual" and ks[-2].kind in block.NORM_KINDS else None
    body = next((k for k in ks if k.kind in (("attention",) if part == "attention" else ("swiglu", "silu", "clamped_swiglu"))), None)
    return dict(kernels=ks, pre=pre, post=post, body=body, residual=ks[-1],
                weights=sum(p.params for p in ps) + sum(k.weight for k in ks if k.kind in block.NORM_KINDS),
                readers=len(ps) - 1, last_weight=ps[-1].params if ps else 0)


@lru_cache(maxsize=256)  # asked per op kind and layer of every step the planner builds; read only
def _parts(m: ModelSpec) -> dict:
    """The block's description split at its halves (_half), with attention's kernel."""
    ks = block.kernels(m)
    half = {p: _half(m, p, [k for k in ks if k.part == p]) for p in block.PARTS}
    return dict(half=half, attention=next(k for k in ks if k.kind == "attention"))


SOFTCAP_CHUNK_ROWS = 128
"""horizon_exec/model/softcap_attention.py CHUNK_ROWS: query rows per chunk."""


def softcap_chunks(seq: int, window: int):
    """(rows, keys) of each chunk of the soft-capped attention (softcap_attention.py _chunks):
    CHUNK_ROWS query rows against the keys from its first row's window (or 0) to its last row."""
    for i0 in range(0, seq, SOFTCAP_CHUNK_ROWS):
        i1 = min(seq, i0 + SOFTCAP_CHUNK_ROWS)
        yield i1 - i0, i1 - (max(0, i0 - window + 1) if window else 0)


@lru_cache(maxsize=1024)
def _widest_chunk(seq: int, window: int) -> tuple[int, int]:
    """(rows, keys) of the soft-capped attention's chunk with the most scores (the first such)."""
    return max(softcap_chunks(seq, window), key=lambda cn: cn[0] * cn[1])


def softcap_attention_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int, backward: bool, window: int = 0) -> int:
    """What the chunked attention (horizon_exec/model/softcap_attention.py: soft-capped scores,
    or sinks, whose fp32 copy the forward holds) holds beyond its inputs, at its peak, over its
    widest chunk of X = B x heads x rows x keys scores (the cap changes none of these sizes).
    Forward: its output o (a q) and fp32 logsumexp (4 a head) per token, then the chunk's
    rows of q (copied: a B c q) and its scores in the compute dtype beside either the copy
    the product makes of the chunk's keys (a B n kv: k is RoPE's strided output) or their fp32
    copy (none in fp32); or the fp32 scores beside logsumexp's own x - max (8 X).
    Backward: o's gradient (a q a token, viewed in the grouped layout), dq (a q), dk and dv
    in fp32 (8 kv) and rowsum(dO o) in fp32 (4 a head), the latter made from fp32
    copies of dO and o and their product (12 q; 4 q in fp32); then per chunk q's and dO's rows
    (2 a B c q), tanh and the softmax in fp32 (8 X) and dP's product in the compute dtype (a X)
    beside either the copy the product makes of the chunk's values (a B n kv) or its fp32 copy
    (4 X; none in fp32)."""
    c, n = _widest_chunk(seq, window)
    B, N, q, heads = micro_batch, micro_batch * seq, m.q_dim, m.n_heads
    X = B * heads * c * n
    keys = a * B * n * m.kv_dim  # a chunk's keys or values, copied by the product
    if not backward:  # with sinks, their fp32 copy (the sinks themselves in fp32)
        sinks = 4 * heads if family(m.family).attention_sinks and a != 4 else 0
        return N * (a * q + 4 * heads) + sinks + max(a * B * c * q + a * X + max(keys, 4 * X if a != 4 else 0), 8 * X)
    held = N * (2 * a * q + 8 * m.kv_dim + 4 * heads)
    rowsum = N * (12 * q if a != 4 else 4 * q)
    chunk = 2 * a * B * c * q + 8 * X + a * X + max(keys, 4 * X if a != 4 else 0)
    return held + max(rowsum, chunk)


def softcap_elementwise_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int, backward: bool, window: int = 0,
                              doc_masks: bool = False) -> int:
    """What the soft-capped attention's own elementwise kernels read plus write, counted as the
    executor's dispatch count counts (every tensor argument and output; its products are
    attention FLOPs): the forward pass, or with backward its backward pass (a recomputing
    backward runs both). Per chunk of c rows and n keys, X = B heads c n scores, R = B heads c
    rows, M the bool mask it builds (c n, or B c n with documents), Q = B heads c hd and K =
    B kv_heads n hd elements:
      forward: 52 X (scale, tanh, cap, mask, logsumexp, subtract, exp; in place, fp32) and its
        two casts (2 (a + 4) X, none in fp32), 20 R (logsumexp's and the subtraction's row
        reads, the row's logsumexp stored), 3a Q (o's rows stored), 2a Q (q's rows copied) and
        4a K (the chunk's keys and values copied by the products);
      backward: 116 X (the forward's scores again, then dP - rowsum, times P, 1 - tanh^2,
        times scale) and four casts, 8 R, 3a Q (dq's rows stored), q's and dO's rows copied
        (2a Q each with grouped heads; with one query head per kv head the products copy them
        each time they read them, 4a Q each), 6a K (keys twice, values once, copied by the
        products) and 2 (20 + a) K (dk's and dv's fp32 sums: the add into the slice, and its
        copy back).
    With sinks instead of a cap (gpt-oss) the cap's passes go (36 X forward, 60 X backward) and
    each row's logsumexp is joined with its head's sink (SINK_FORWARD_ROW_BYTES a row), the
    backward adds the sinks' gradient (SINK_BACKWARD_ROW_BYTES a row, and the nh sinks widened,
    summed, negated and cast back). The copies are those of the executor's layouts: RoPE leaves q and k in the (B, T, heads,
    hd) order of their projections, v is a transposed view of its own, and dO arrives
    transposed (layers.self_attention); a tensor of one head is in its own order already;
    and the mask's own kernels per chunk (masked_fill reads M; causal: arange, gt; a window:
    subtract, compare, or; documents: compare, or). Per pass: o, or dq, made like q (2a a q
    element) and the fp32 logsumexp (4 a row); the backward's fp32 dk and dv zeroed, rowsum(dO o)
    in fp32 (dO and o widened, their product, its sum), dk and dv cast back."""
    if not chunked_attention(m):
        return 0
    B, nh, hd, kv = micro_batch, m.n_heads, m.hd, m.n_kv_heads * m.hd
    N, q, grouped = B * seq, m.q_dim, m.n_heads > m.n_kv_heads
    cast = kernel_bytes.casts(a)
    capped, sinks = bool(m.attn_softcap), family(m.family).attention_sinks
    # per score: the cap's passes (forward tanh and times cap; backward those again and 1 - tanh^2)
    fwd_x, bwd_x = (52, 116) if capped else (36, 60)
    total = 2 * a * N * q  # o or dq: empty_like(q) reads and writes
    if backward:
        total += 8 * N * kv + (cast * N * q + 12 * N * q + 4 * N * q + 4 * N * nh) + cast * N * kv
        if sinks:  # the sinks' gradient: exp(sink - lse) (the sinks widened, read), times rowsum(dO o),
            # summed over rows (4 nh written), cast back and negated (2a nh)
            total += SINK_BACKWARD_ROW_BYTES * N * nh + (8 + 2 * a + cast) * nh
    else:
        total += 4 * N * nh
    for c, n in softcap_chunks(seq, window):
        X, R, Q, K = B * nh * c * n, B * nh * c, B * nh * c * hd, B * m.n_kv_heads * n * hd
        M = B * c * n if doc_masks else c * n
        mask = M + 2 * 8 * (c + n) + c * n  # masked_fill's read; arange i, j; gt
        if window:
            mask += 20 * c * n + 8 * (c + n)
        if doc_masks:
            mask += 8 * B * (c + n) + B * c * n + c * n + 2 * B * c * n
        kv_copies = a * K if m.n_kv_heads > 1 else 0  # one head: (B, T, 1, hd) is already its own layout
        row_copies = 2 * a * Q if grouped else (4 * a * Q if nh > 1 else 0)  # q's or dO's rows, a pass
        if backward:
            total += (bwd_x + 2 * cast) * X + 8 * R + 3 * a * Q + 2 * row_copies + 6 * kv_copies + 2 * (20 + a) * K + mask
        else:
            total += (fwd_x + cast) * X + 20 * R + 3 * a * Q + (2 * a * Q if nh > 1 else 0) + 4 * kv_copies + mask
            if sinks:  # each row's logsumexp joined with its head's sink (the nh sinks read)
                total += SINK_FORWARD_ROW_BYTES * R + 4 * nh
    if sinks and not backward:  # the sinks widened to fp32
        total += (cast // 2) * nh
    return int(total)


SINK_FORWARD_ROW_BYTES = 8
"""A chunk's rows' logsumexp joined with their sink (torch.logaddexp: 4 read, 4 written a row)."""
SINK_BACKWARD_ROW_BYTES = 32
"""A row's sink probability and its share of the sink's gradient: exp(sink - lse) (8), in place
(8), times rowsum(dO o) in place (12), summed (4)."""


def _saved_kernel(k, a: int, N: int) -> int:
    """Bytes autograd keeps of kernel k over N tokens: per token, and per call (Gemma's (1 + w))."""
    return N * kernel_bytes.saved_bytes(k, a) + kernel_bytes.saved_per_call_bytes(k)


def _saved(half: dict, a: int, N: int) -> int:
    return sum(_saved_kernel(k, a, N) for k in half["kernels"])


def block_input_saved(m: ModelSpec, a: int) -> bool:
    """Whether the block's graph keeps its input x itself: the attention's projections read x
    (no pre-norm: OLMo-2), or in fp32 the pre-norm's fp32 view of x is x. A buffer of its own
    while the block runs (not in block_saved_bytes), but a kept layer's graph holds it."""
    pre = _parts(m)["half"]["attention"]["pre"]
    return pre is None or (pre.reads_block_input and kernel_bytes.keeps_own_input(pre, a))


def _forward_peak_bytes(m: ModelSpec, parts: dict, micro_batch: int, seq: int, a: int, mask: int, window: int) -> int:
    """A no-grad forward's temporary peak (block_temp_peak_bytes), the largest of: at the MLP's
    activation, x1, the MLP pre-norm's output and the activation's inputs and outputs (an MoE
    MLP: _moe_forward_bytes); at the attention call, the first pre-norm's output and what
    attention holds (SDPA: q, k, v, o, the fp32 logsumexp and an explicit mask's bool and
    additive forms; soft-capped: q, k, v and softcap_attention_bytes); inside a q/k norm, q, k
    and v beside its statistics; inside RoPE on q, q, k and v (a fused projection's output and
    the v copied out of it) beside q * cos, rotate_half(q) and its product with sin; inside RoPE
    on k, the same with q rotated beside them (q's own output freed, unless it is a view of the
    fused one); inside a post-norm, its input (and x1, in the MLP half)."""
    H, N = m.hidden, micro_batch * seq
    att, mlp = parts["half"]["attention"], parts["half"]["mlp"]
    pre1 = a * att["pre"].width if att["pre"] else 0
    qkv = a * sum(p.out_features for p in block.projections(m)[:att["readers"]])
    if parts["attention"].chunked:
        p_attn = N * (pre1 + qkv) + softcap_attention_bytes(m, micro_batch, seq, a, False, window)
    else:
        p_attn = N * (pre1 + kernel_bytes.saved_bytes(parts["attention"], a)) + mask * (1 + a)
    points = [p_attn, *(N * (pre1 + qkv + _norm_forward_bytes(k, a)) for k in _inner_norms(att)),
              *(N * (a * H * (2 if half is mlp else 1) + _norm_forward_bytes(half["post"], a))
                for half in (att, mlp) if half["post"])]
    split = next((k for k in att["kernels"] if k.kind == "split"), None)
    held = qkv + (a * split.kv_width if split else 0)  # a fused q|k|v output and the v copied out of it
    ropes = [k for k in att["kernels"] if k.kind == "rope"]
    if ropes:  # inside RoPE on q; then on k, beside q rotated (q's projection output freed, unless a view of the fused one)
        points.append(N * (pre1 + held + 3 * a * ropes[0].width))
        if len(ropes) > 1:
            q = ropes[0].width
            points.append(N * (pre1 + held - (0 if split else a * q) + a * q + 3 * a * ropes[1].width))
    if m.n_experts:
        points.append(_moe_forward_bytes(m, N, a))
    else:
        pre2 = a * mlp["pre"].width if mlp["pre"] else 0
        points.append(N * (a * H + pre2 + kernel_bytes.live_in_forward_bytes(mlp["body"], a)))
    return int(max(points))


def block_temp_peak_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int, backward: bool,
                          mask: int = 0, window: int = 0) -> int:
    """Peak bytes of the op's device temporaries, as the executor measures them (every fresh
    aten allocation of the op, its output included, until freed): the largest of the points
    below, found by walking the block's description (_parts: per half a pre-norm, a body and a
    post-norm, each optional) with what each kind of kernel keeps (kernel_bytes.py).

    Forward (no autograd): _forward_peak_bytes.

    Backward (forward with grad, then autograd.grad). Autograd keeps what each kernel saves
    (per norm its fp32 input, in fp32 the pre-norm's is x itself, the cast back, or with the
    weight multiplied in fp32 the fp32 normalised rows, the output a projection reads and 4
    bytes of rsqrt per row; a residual whose output the MLP reads, x1; q, k, v, o and the
    attention's fp32 logsumexp; the activation's tensors; an MoE block's router, routed rows
    and shared expert's), and the output y (aH) is alive throughout. The peak is then one of
      - at the forward-with-grad's last add: everything saved, the residual x1 (unless a
        kernel saves it: in fp32 the MLP pre-norm's input, or the MLP's projections), the
        MLP's output (an MoE block's: the zero tensor its experts' rows were added into and,
        with a shared expert, its gated output) and their sum (3 or 4 aH);
      then, walking the halves backward (the MLP's, then attention's), with what the kernels
      not yet reached saved, the weight gradients made so far (autograd.grad returns them
      together) and, in the attention half, the gradient of x1 (aH):
      - in a norm's backward (post-norm, then pre-norm): its fp32 input and five fp32
        temporaries (20 per element), its weight's gradient;
      - in the MLP's backward: the activation's gradients and the last projection's weight
        gradient (dense: down's H x F, its bias too); an MoE block's experts instead, at
        either end of their loop (_expert_loop_bytes);
      - in a chunked attention's backward (softcap_attention_bytes), with o_proj's gradient; in
        MLA's SDPA backward, dO, dq, dk and dv as wide as q (v padded), with o_proj's gradient;
      - with an ungated shared expert (DeepSeek's), in its backward before the routed loop's:
        everything saved, y, the MLP output's gradient, its SwiGLU's gradients and its input's,
        and down's weight gradient (the loop's points then hold its weight gradients too);
      - at the end, in the q/k norms' or the first projection's backward (backward_end_bytes).

    An explicit mask (`mask` = its elements M, mask_bytes; 0 when causal) adds: in the forward,
    at the attention call, the bool mask (M) and the additive mask SDPA makes of it in the
    compute dtype (aM) next to the first norm's output and what attention keeps (q, k, v, o,
    the fp32 logsumexp); in the backward, aM while autograd keeps the additive mask (until the
    attention's backward), and the same attention point during the forward-with-grad.
    """
    H, N = m.hidden, micro_batch * seq
    parts = _parts(m)
    att, mlp = parts["half"]["attention"], parts["half"]["mlp"]
    if not backward:
        return _forward_peak_bytes(m, parts, micro_batch, seq, a, mask, window)
    x1_in_mlp = N * kernel_bytes.saved_bytes(att["residual"], a)  # x1 saved by the MLP's projections
    saved = {"attention": _saved(att, a, N) - x1_in_mlp, "mlp": _saved(mlp, a, N) + x1_in_mlp}  # bytes
    gates = sum(k.kind == "gate_mul" for k in mlp["kernels"])
    # an ungated shared expert's output (DeepSeek's) beside the routed experts' before their sum
    gates += bool(m.shared_expert_ffn_hidden) and not family(m.family).moe.shared_gate
    pre2 = mlp["pre"]  # x1 is alive unless a kernel keeps it: the MLP's projections, or its pre-norm as its input
    x1 = 0 if x1_in_mlp or (pre2 and not pre2.reads_block_input and kernel_bytes.keeps_own_input(pre2, a)) else a * H
    points = [saved["attention"] + saved["mlp"] + N * (x1 + (2 + gates) * a * H) + a * mask
              + expert_padding_bytes(m, a, parts)]
    if m.n_experts:
        points += [_expert_loop_bytes(m, N, a, {k: v // N for k, v in saved.items()}, parts) + a * mask]  # no per-call terms
    S = m.shared_expert_ffn_hidden
    if S and not family(m.family).moe.shared_gate:  # an ungated shared expert's backward, before the routed loop's:
        # beside everything saved, y, the MLP output's gradient, its SwiGLU's gradients, its input's, down's weight's
        sw = next(k for k in mlp["kernels"] if k.kind == "swiglu" and not k.routed)
        points.append(saved["attention"] + saved["mlp"] + N * (3 * a * H + kernel_bytes.backward_gradients_bytes(sw, a))
                      + a * S * H + a * mask + expert_padding_bytes(m, a, parts))
    weights, earlier, dx1 = 0, saved["attention"], 0
    for name, half in (("mlp", mlp), ("attention", att)):
        live = saved[name]
        held = a * mask if name == "mlp" else 0  # the additive mask, until attention's backward

        def norm_point(k, grads):
            return (earlier + live - _saved_kernel(k, a, N) + N * (kernel_bytes.norm_backward_temp_bytes(k, a)
                    + a * H + dx1) + grads * a + held)

        if half["post"]:
            points.append(norm_point(half["post"], weights + half["post"].weight) + (a * mask if name == "attention" else 0))
            live -= _saved_kernel(half["post"], a, N)
            weights += half["post"].weight
        if name == "mlp" and not m.n_experts:
            points.append(earlier + live + N * (kernel_bytes.backward_gradients_bytes(half["body"], a) + a * H)
                          + (weights + half["last_weight"]) * a + held)
        if name == "attention" and parts["attention"].chunked:  # in its backward, o_proj's gradient made
            o_proj = block.projections(m)[att["readers"]].params
            points.append(earlier + live + N * (2 * a * H) + (weights + o_proj) * a
                          + softcap_attention_bytes(m, micro_batch, seq, a, backward=True, window=window))
        if name == "attention" and parts["attention"].v_width:  # MLA: SDPA's backward, o_proj's gradient made,
            k = parts["attention"]  # beside what the half saved: dO, dq, dk and dv, each as wide as q (v padded)
            o_proj = next(p.params for p in block.projections(m) if p.module == "self_attn.o_proj")
            points.append(earlier + live + N * (2 * a * H + a * (3 * k.width + k.kv_width)) + (weights + o_proj) * a)
        if half["pre"]:
            weights += half["weights"] - half["pre"].weight - (half["post"].weight if half["post"] else 0)
            live = _saved_kernel(half["pre"], a, N)
            weights += half["pre"].weight  # the block's first norm: every weight's gradient (layer_params)
            points.append(norm_point(half["pre"], weights if name == "mlp" else m.layer_params))
        else:
            weights += half["weights"] - (half["post"].weight if half["post"] else 0)
        earlier, dx1 = 0, a * H
    points.append(backward_end_bytes(m, micro_batch, seq, a))
    if mask:
        points.append(saved["attention"] + mask * (1 + a))
    return int(max(points))


def backward_end_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int) -> int:
    """The backward's last points, where every weight gradient but a few is live and nothing
    of the MLP half's saved tensors: the q/k norms' backward (_inner_norm_points), the
    attention pre-norm's (as block_temp_peak_bytes walks it: y, x1's gradient, its fp32 input
    and temporaries, every weight gradient) and the first projection's
    (_first_projection_point). A kept layer's backward from its saved graph
    (kept_work.saved_backward_workspace_bytes) peaks here at the latest."""
    H, N = m.hidden, micro_batch * seq
    att = _parts(m)["half"]["attention"]
    points = [_first_projection_point(m, att, N, a), *_inner_norm_points(m, att, N, a, a * H)]
    if att["pre"]:
        k = att["pre"]
        points.append(N * (kernel_bytes.norm_backward_temp_bytes(k, a) + 2 * a * H) + m.layer_params * a)
    return int(max(points))


def _first_projection_point(m: ModelSpec, att: dict, N: int, a: int) -> int:
    """The backward's last GEMMs, the first projection's (q, or a fused q|k|v): y, x1's gradient,
    the input gradient it makes and, when several projections read the same input, the running
    sum of theirs; the gradient of its output (a x its out_features); what the pre-norm saved;
    every weight gradient but the pre-norm's."""
    pre, ps = att["pre"], [p for p in block.projections(m) if not p.module.startswith("mlp.")]
    running = a * m.hidden * (1 if pre and att["readers"] > 1 else 0)
    return (N * (3 * a * m.hidden + running + a * ps[0].out_features) + (_saved_kernel(pre, a, N) if pre else 0)
            + (m.layer_params - (pre.weight if pre else 0)) * a)


def _inner_norms(half: dict) -> list:
    """The half's norms that are neither its pre-norm nor its post-norm: q's and k's."""
    return [k for k in half["kernels"] if k.kind in block.NORM_KINDS and k is not half["pre"] and k is not half["post"]]


def _norm_forward_bytes(k, a: int) -> int:
    """Per token, the most a norm holds in a no-grad forward beyond its input: its fp32 copy and
    its square (none in fp32, where the copy is the input) before the mean; or the normalised
    fp32 rows and the output (Llama's: the cast back and the weight's product; with the weight
    multiplied in fp32: that product and its cast)."""
    w = k.width
    if a == 4:
        return max(4 * w + 4 * k.rows, 8 * w)
    return max(8 * w + 4 * k.rows, (8 + a if k.fp32_weight else 4 + 2 * a) * w)


def _inner_norm_points(m: ModelSpec, half: dict, N: int, a: int, dx: int) -> list[int]:
    """The attention's q and k norms' backward points (per head, Qwen3's; over the whole
    projection, OLMo-2's), which run on q and k once the three projections have. Autograd runs
    the later norm first, so at norm i the norms before it still hold what they saved; q, k
    and v's projections have no weight gradient yet, every other weight has; beside y and x's
    running gradient (dx), its fp32 input and five fp32 temporaries (20 per element)."""
    inputs = sum(p.params for p in block.projections(m)[:half["readers"]])
    grads = m.layer_params - inputs - (half["pre"].weight if half["pre"] else 0)
    inner = _inner_norms(half)
    return [sum(_saved_kernel(j, a, N) for j in inner[:i])
            + N * (kernel_bytes.fp32_input_bytes(k, a) + 20 * k.width + a * m.hidden + dx) + grads * a
            for i, k in enumerate(inner)]


def _moe_forward_bytes(m: ModelSpec, N: int, a: int) -> int:
    """A bound on an MoE MLP's no-grad forward (horizon_exec/model/moe_block.py moe_mlp): beside
    x1 and the norm's output (2 aH), the larger of the shared expert's SwiGLU (gate, up, silu,
    product: 4 aS), and, with the shared output (aH), the zero output (aH) and what routing
    leaves (the weights, fp32 at most, and ids: 12 k; each routed row's slot and token: 16 k),
    either one expert's rows, at most every token (a router may send them all to one expert;
    gathered, gate|up, silu and product, aH + 4 aI a row; or with down's output instead of
    silu, 2 aH + 3 aI; or with its weighted copy and the gathered weights instead of the
    product, 3 aH + 2 aI + 4) or the gated shared output and the sum (2 aH). (The backward's
    expert loop is priced at the expected most loaded expert, expert_load.max_rows: there the
    saved tensors dominate; here one expert's rows are the peak.)"""
    H, I, S, k = m.hidden, m.expert_ffn_hidden, m.shared_expert_ffn_hidden, m.experts_per_token
    two = 2 * a * H * N
    shared = N * a * H if S else 0
    base = two + shared + N * (a * H + 28 * k)
    hot = padded_rows(N, a)
    loop = base + hot * max(a * H + 4 * a * I, 2 * a * H + 3 * a * I, 3 * a * H + 2 * a * I + 4)
    end = base + (2 * N * a * H if S else 0)
    return int(max(two + N * 4 * a * S, loop, end))


def _routed_row_bytes(m: ModelSpec, a: int, parts: dict) -> float:
    """What the routed kernels save per routed row (a token's k rows share its per-token figure)."""
    return sum(kernel_bytes.saved_bytes(kk, a) for kk in parts["half"]["mlp"]["kernels"] if kk.routed) / m.experts_per_token


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
    gates = sum(kk.kind == "gate_mul" for kk in parts["half"]["mlp"]["kernels"])
    experts = [p.params for p in block.projections(m) if p.experts]  # each stack's weights and biases
    act = parts["half"]["mlp"]["body"]
    # an ungated shared expert's backward (DeepSeek's) may run before the routed loop: its weight gradients then live
    shared = 0 if family(m.family).moe.shared_gate else a * sum(
        p.params for p in block.projections(m) if p.module.startswith("mlp.shared_expert"))
    routed = sum(kernel_bytes.saved_bytes(kk, a) for kk in parts["half"]["mlp"]["kernels"] if kk.routed)  # per token
    per_row, cold = _routed_row_bytes(m, a, parts), min_rows(N, k, E)
    base = N * (saved["attention"] + saved["mlp"] + 4 * k + (1 + gates) * aH) + expert_padding_bytes(m, a, parts) + shared
    hot = padded_rows(max_rows(N, k, E), a)
    fp32_weights = 8 * H if family(m.family).moe.fp32_routing_weights and a != 4 else 0
    combine = base + (2 * aH + fp32_weights) * hot
    swiglu = base + (aH + kernel_bytes.routed_backward_row_bytes(act, a) // k) * hot + a * H * I
    adds = [base + N * aH * (2 + (1 if j > 1 or gates else 0)) + j * (sum(experts) // E * a - cold * per_row)
            for j in (1, 2)]
    last = base - N * routed + 3 * N * aH + sum(experts) * a
    stack = base - N * routed + N * aH + (sum(experts) + max(experts)) * a
    return int(max(combine, swiglu, *adds, last, stack))


def block_saved_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int) -> int:
    """What autograd keeps from a block's forward for its backward when the graph persists (no
    recompute): what each kernel saves (kernel_bytes.saved_bytes) and the block's output,
    which the next block saves as its input."""
    N, ks = micro_batch * seq, block.kernels(m)
    return int(N * (sum(kernel_bytes.saved_bytes(k, a) for k in ks) + a * m.hidden)
               + sum(kernel_bytes.saved_per_call_bytes(k) for k in ks))


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
    temporaries, the normed rows and dh). The norm is the family's (final_norm: with its weight
    multiplied in fp32 the normalised rows it keeps are fp32; Gemma's keeps its (1 + w); a
    LayerNorm keeps no fp32 copy, only its mean and rstd per row, and its backward makes dx and
    the gradients of its weight and bias); soft-
    capped logits (Gemma 2) keep the chunk's tanh (a a logit) until the gradient is scaled."""
    H, V = m.hidden, m.vocab
    c = min(chunk_tokens, tokens)
    in32 = 4 * H if a != 4 else 0
    loss = 4  # the fp32 loss accumulator
    if loss_kernel == "fused":
        chunk = c * V * a + 4 * c + 4
    else:
        chunk = max(c * V * 8 + c * 9, c * V * (4 + (a if a != 4 else 0)) + c * (8 + 4 + 4 + 1))
    if m.logit_softcap:  # tanh of the chunk's logits, kept for the cap's gradient
        chunk += c * V * a
    norm = final_norm(m)
    if norm.kind == "layernorm":  # it keeps its mean and rstd (2a a row); its backward makes dx and two weight grads
        logits = chunk + tokens * (2 * a * H + 2 * a) + loss
        norm_bwd = tokens * (3 * a * H + 2 * a) + 2 * H * a + loss
        return int(max(logits, norm_bwd))
    normed = 4 * H if norm.fp32_weight else a * H  # what the norm's weight multiply saved
    logits = chunk + tokens * (in32 + normed + 2 * a * H + 4) + kernel_bytes.saved_per_call_bytes(norm) + loss
    norm_bwd = tokens * (in32 + 20 * H + 2 * a * H) + H * a + loss  # + the norm weight's grad
    return int(max(logits, norm_bwd))


def block_workspace_bytes(m: ModelSpec, micro_batch: int, seq: int, a: int, backward: bool,
                          attention: str = "flash", mask: int = 0, window: int = 0) -> int:
    """Op.workspace_bytes: the temporary peak less the output the op hands over as a schedule
    buffer (y, or dx), which the simulator already charges from the op's start. Eager
    attention adds the T x T scores and probabilities per head it keeps for backward. window:
    the layer's sliding window (a soft-capped attention's chunks see fewer keys)."""
    ws = block_temp_peak_bytes(m, micro_batch, seq, a, backward, mask, window) - micro_batch * seq * m.hidden * a
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
