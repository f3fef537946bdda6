"""What each kind of the block's non-GEMM kernels (specs/block.py KINDS) moves and keeps, per
token, for a kernel of width w elements in a compute dtype of a bytes:

  kind       forward r+w bytes         backward r+w bytes            autograd keeps
  rmsnorm    (20 + 2a + c) w + 24 R    (72 + 6a + c) w + 32 R        its fp32 input (4w), the cast
                                       + 3a w per extra reader        back (aw), its output when a
                                                                      projection reads it (aw), rsqrt
                                                                      (4 R)
  layernorm  2a w + 2a R               3a w + 2a R                   its input (aw; none when it is
                                       + 3a w per extra reader        the block's input x), its output
                                                                      when a projection reads it (aw),
                                                                      mean and rstd (2a R)
  rope       10a w                     16a w (14a + the transposing   nothing (cos/sin are tables)
                                       clone of its gradient)
  attention  0 (its own kernel)        0                              q, k, v, o: a (2w + 2kv), and
                                                                      the fp32 logsumexp (4 a head);
                                                                      MLA (v_width): v and o padded
                                                                      to w, o's v_width part copied
                                                                      for o_proj: a (3w + kv + v)
  swiglu     5a w (SiLU 2a, gate*up 3a) 9a w                          gate, up, silu, product: 4a w
  clamped_   16a w (two clamps, scale,   (43a + 4) w (the gate          its input, gate|up (2a w),
  swiglu     sigmoid, three products,  recomputed, its derivative,    and its output, which down
             up + 1)                   two clamp masks)               reads (a w): 3a w
  silu       2a w                      3a w                           its input and output: 2a w
  residual   3a w                      3a w (the gradients' sum)      nothing (its output when the
                                                                      MLP's projections read it, aw)
  split      2a c (c copied out)       2a w (the parts' gradients     nothing (views)
                                       concatenated)

RoPE on a fraction f < 1 of each head (Kernel.rotary: GPT-NeoX) rotates three pieces instead
of two (rotate_half's halves of the rotated part, and the rest): (9 + f) a w forward and
(17 + f) a w backward, with w the whole heads' width; without the transposing clone
(Kernel.grad_copied false: the fused split takes the gradient as it is) 2a w less. A
LayerNorm's mean and rstd are in its input's dtype on the CPU (fp32 on CUDA: 4 bytes a token
more for a bf16 block, not priced); its forward reads its weight and bias (2a w a pass), its
backward reads both and writes their gradients (4a w a pass).

A norm that multiplies its weight in fp32 (Kernel.fp32_weight: OLMo-2, Gemma) moves
fp32_weight_extra's bytes more and keeps the fp32 normalised rows (4w) instead of the cast back;
one whose weight is an offset from one (Kernel.unit_offset: Gemma) keeps its fp32 (1 + w) per
call (saved_per_call_bytes).

An MoE block (specs/block.py _moe_kernels) adds four kinds. Their traffic figures are ESTIMATES
from the kernels a looped-expert executor runs (read + write of each tensor once), not checked
by a dispatch count; what autograd keeps of them was read off the executor's
(horizon_exec/model/moe_block.py) live tensors (tests/test_moe_memory.py):

  router     (a + 12) E + (24 + a) k   (24 + a) E + 24 k             fp32 probabilities (4E),
             (logits read; fp32 softmax (top-k values' grads           int64 ids (8k), the fp32
             written, read, written; top-k scattered into E; softmax   top-k values and their
             picks k values + int64 ids;    backward reads p and dp)   sum (4k + 4) the
             renormalise; cast)                                        renormalising division keeps
  dispatch   2a w (gather the token rows)  3a w (index_add of the rows'  the gathered rows (a w,
                                       gradients into a zeroed dx)    gate_up's weight gradient
                                                                      reads them), each row's slot
                                                                      and token ids (16 a row)
  combine    4a w (scale by the weight,    5a w (gather dy per row, the  the down output (a w, for
             index_add into the output)    rows' and weights' grads)    the weight's gradient), the
                                                                      scaled rows (a w, index_add_
                                                                      keeps its source), each row's
                                                                      weight (4 a row: fp32 in
                                                                      Mixtral)
  gate_mul   5a w (sigmoid gate times the  6a w                          the shared output (a w) and
             shared output, added in)                                 the sigmoid (a)

A split is a fused projection's output (w wide: Phi-3's q|k|v, gate|up) taken apart; c is
the part the forward copies (Kernel.kv_width). A projection with a bias adds, in the backward,
its bias's gradient: its output gradient read once more (a per output element).

gpt-oss's router (Kernel.topk_first) takes the top k of its logits and a softmax over those k in
the compute dtype: a E + (3a + 8) k forward (the logits read, the k values and int64 ids written,
their softmax), a E + (4a + 8) k backward (the softmax's backward, the k gradients scattered into
a zero E row); it keeps the softmax's output and the ids (a k + 8 k). With the load-balancing loss
it also makes the fp32 softmax over all E the loss reads ((a + 8) E forward, (20 + 3a) E backward)
and keeps it (4E). Estimates, like the other routing kernels'.

w = k H for dispatch and combine (each token's k routed rows), E for the router (k = its rows).
A router that feeds the load-balancing loss (Kernel.aux_loss: router_aux_loss_coef > 0) adds
4E forward (its fp32 probabilities read once more, summed per expert; the counts are the
dispatch's own bincount) and 8E backward (that sum's gradient, broadcast, added into the
probabilities' gradient: read and written once); it keeps nothing more. What the loss itself
costs per micro-batch (two E-vectors per layer, a handful of E-wide ops) is not priced: it is
under a microsecond beside a layer's milliseconds (horizon_exec/model/router_aux.py).

R: the rows a norm reduces over per token; c = 2 (a + 4), the casts around fp32 statistics
(0 in fp32). A norm's forward and backward also read its weight (a per element a pass), RoPE
its cos and sin tables (2 seq hd a a pass). Every figure was checked against a dispatch-level
count of the executor's kernels (tests/test_calibrate.py): read the aten calls of one block
under a TorchDispatchMode and sum what each reads plus writes; nothing here is fitted. A new
kind of kernel (an MoE router, a dispatch) adds its row here.
"""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.block import Kernel


def casts(a: int) -> int:
    """Bytes per element of the two casts around fp32 statistics (none when a is fp32)."""
    return 2 * (a + 4) if a != 4 else 0


def norm_forward(width: int, rows: int, a: int) -> int:
    # x.float() | pow | mean | *rsqrt | .to(a) | w*h ; plus 24 B of statistics per row
    return (20 + 2 * a + casts(a)) * width + 24 * rows


def norm_backward(width: int, rows: int, a: int) -> int:
    # grad*w | grad*h | sum (dw) | cast | 5 fp32 products, 2 reductions, add | cast back
    return (72 + 6 * a + casts(a)) * width + 32 * rows


def _unknown(k: Kernel):
    return HorizonError(f"kernel kind {k.kind!r} has no byte counts (schedule/kernel_bytes.py)")


def forward_bytes(k: Kernel, a: int) -> int:
    """Bytes per token its forward reads plus writes."""
    w = k.width
    per_element = {"attention": 0, "swiglu": 5 * a, "clamped_swiglu": 16 * a, "silu": 2 * a, "residual": 3 * a,
                   "dispatch": 2 * a, "combine": 4 * a, "gate_mul": 5 * a}
    if k.kind == "router" and k.topk_first:
        return a * w + (3 * a + 8) * k.rows + ((a + 8) * w if k.aux_loss else 0)
    if k.kind == "split":
        return 2 * a * k.kv_width
    if k.kind == "layernorm":
        return 2 * a * w + 2 * a * k.rows
    if k.kind == "rope":
        return int(rope_elements(k, backward=False) * a * w)
    if k.kind == "rmsnorm":
        return norm_forward(w, k.rows, a) + (fp32_weight_extra(a)[0] * w if k.fp32_weight else 0)
    if k.kind == "router":
        return (a + 12 + (4 if k.aux_loss else 0)) * w + (24 + a) * k.rows
    if k.kind not in per_element:
        raise _unknown(k)
    return per_element[k.kind] * w


def backward_bytes(k: Kernel, a: int) -> int:
    """Bytes per token its backward reads plus writes (the forward-with-grad is forward_bytes)."""
    w = k.width
    per_element = {"attention": 0, "swiglu": 9 * a, "clamped_swiglu": 43 * a + 4, "silu": 3 * a, "residual": 3 * a,
                   "dispatch": 3 * a, "combine": 5 * a, "gate_mul": 6 * a, "split": 2 * a}
    if k.kind == "router" and k.topk_first:
        return a * w + (4 * a + 8) * k.rows + ((20 + 3 * a) * w if k.aux_loss else 0)
    if k.kind == "layernorm":
        return 3 * a * w + 2 * a * k.rows + 3 * a * w * (k.fan_out - 1)
    if k.kind == "rope":
        return int(rope_elements(k, backward=True) * a * w)
    if k.kind == "rmsnorm":
        return (norm_backward(w, k.rows, a) + (fp32_weight_extra(a)[1] * w if k.fp32_weight else 0)
                + 3 * a * w * (k.fan_out - 1))
    if k.kind == "router":
        return (24 + a + (8 if k.aux_loss else 0)) * w + 24 * k.rows
    if k.kind not in per_element:
        raise _unknown(k)
    return per_element[k.kind] * w


def rope_elements(k: Kernel, backward: bool) -> float:
    """RoPE's bytes per element of its width, in units of the compute dtype's a (docstring)."""
    f = k.rotary
    if not backward:
        return 10.0 if f == 1 else 9.0 + f
    return (14.0 if f == 1 else 17.0 + f) + (2.0 if k.grad_copied else 0.0)


def fp32_weight_extra(a: int) -> tuple[int, int, int]:
    """What a norm that multiplies its weight in fp32 (Kernel.fp32_weight) moves beyond one that
    casts first, per element: forward (the product in fp32, 8 B, instead of a's 2a), backward
    (the gradient widened and its products in fp32) and per pass of the backward (its weight's
    gradient reduced in fp32, then cast). Nothing in fp32, where both orders are one. Measured
    by a dispatch count of rms_norm with and without fp32_weight (bf16: 4 w, 12 w, 8 weight)."""
    return (8 - 2 * a, 6 * (4 - a), 4 * (4 - a))


def per_pass_bytes(k: Kernel, seq: int, head_dim: int, a: int, backward: bool = False) -> int:
    """Bytes a pass (forward or backward) reads once, whatever its tokens: a norm's weight,
    RoPE's cos and sin tables."""
    if k.kind == "rmsnorm":
        return a * k.weight + (fp32_weight_extra(a)[2] * k.weight if backward and k.fp32_weight else 0)
    if k.kind == "layernorm":  # weight and bias read; backward: their gradients written too
        return a * k.weight * (2 if backward else 1)
    if k.kind == "rope":
        return 2 * seq * head_dim * a
    return 0


def fp32_input_bytes(k: Kernel, a: int) -> int:
    """A norm's fp32 copy of its input, per token (in fp32 the block's input x is its own
    copy: not a temporary)."""
    if k.kind == "layernorm":  # its statistics come from its input as it is
        return 0
    if a == 4:  # the input itself: none when it is the block's x; the whole of a wider tensor it is a view of
        return 0 if k.reads_block_input else 4 * (k.input_width or k.width)
    return 4 * k.width


def keeps_own_input(k: Kernel, a: int) -> bool:
    """Whether what a norm keeps of its input is the input tensor itself: a LayerNorm's always,
    an RMSNorm's in fp32 (its fp32 view of x is x); otherwise it keeps an fp32 copy."""
    return k.kind == "layernorm" or a == 4


def norm_backward_temp_bytes(k: Kernel, a: int) -> int:
    """Per token, what a norm's backward holds beyond its saved tensors and the incoming
    gradient: an RMSNorm its fp32 input and five fp32 temporaries (20 per element); a
    LayerNorm its input's gradient (a per element; the kernel's statistics are per row)."""
    if k.kind == "layernorm":
        return a * k.width
    return fp32_input_bytes(k, a) + 20 * k.width


def saved_bytes(k: Kernel, a: int) -> int:
    """Bytes per token autograd keeps of it from the forward for the backward."""
    w = k.width
    if k.kind == "layernorm":  # its input (unless the block's own x), output, mean and rstd
        return (0 if k.reads_block_input else a * w) + (a * w if k.output_saved else 0) + 2 * a * k.rows
    if k.kind == "rmsnorm":  # fp32 input, normalised rows (cast back, or fp32), output, rsqrt
        return fp32_input_bytes(k, a) + (4 if k.fp32_weight else a) * w + (a * w if k.output_saved else 0) + 4 * k.rows
    if k.kind == "attention":
        if k.v_width:  # MLA: v padded to the q/k head width (so is o), o's unpadded part copied for o_proj
            return a * (3 * w + k.kv_width + k.v_width) + 4 * k.rows
        return a * (2 * w + 2 * k.kv_width) + 4 * k.rows
    if k.kind in ("swiglu", "silu", "clamped_swiglu"):
        return {"swiglu": 4, "silu": 2, "clamped_swiglu": 3}[k.kind] * a * w
    if k.kind == "residual":
        return a * w if k.output_saved else 0
    if k.kind in ("rope", "split"):
        return 0
    if k.kind == "router" and k.topk_first:  # the k weights' softmax output, the ids; the loss's fp32 softmax
        return (a + 8) * k.rows + (4 * w if k.aux_loss else 0)
    if k.kind == "router":  # renormalising keeps the top-k values and their sum: 4k + 4
        fp32_input = 4 * k.input_width if a != 4 else 0  # an fp32 router's copy of its input (DeepSeek)
        return 4 * w + 8 * k.rows + (4 * k.rows + 4 if k.renormalised else 0) + fp32_input
    if k.kind == "dispatch":
        return a * w + 16 * k.rows
    if k.kind == "combine":
        return 2 * a * w + 4 * k.rows
    if k.kind == "gate_mul":
        return a * w + a
    raise _unknown(k)


def saved_per_call_bytes(k: Kernel) -> int:
    """Bytes autograd keeps of it per call, whatever the tokens: Gemma's norm its fp32 (1 + w)."""
    return 4 * k.weight if k.kind == "rmsnorm" and k.unit_offset else 0


def live_in_forward_bytes(k: Kernel, a: int) -> int:
    """Bytes per token of its tensors the template's no-grad forward holds at the MLP's peak:
    the activation's inputs and outputs (the clamped SwiGLU: its input and two of its I-wide
    tensors at once)."""
    if k.kind in ("swiglu", "silu", "clamped_swiglu"):
        return (2 if k.kind == "silu" else 4) * a * k.width
    return 0


def backward_gradients_bytes(k: Kernel, a: int) -> int:
    """Bytes per token its backward holds at once beyond what was saved: the activation's output
    and input gradients (2a w); a plain activation's output is freed by then (the projection
    that read it has made its gradients), so a w net."""
    if k.kind == "swiglu":
        return 2 * a * k.width
    if k.kind == "silu":
        return a * k.width
    if k.kind == "clamped_swiglu":  # its input's gradient (2a w) and two temporaries, its output's freed
        return 3 * a * k.width
    return 0


def routed_backward_row_bytes(k: Kernel, a: int) -> int:
    """Per token (its k routed rows), what a routed activation's backward holds beyond what it
    saved: the SwiGLU's product, up and gate gradients (3a w); the clamped SwiGLU's output
    gradient, its input's gradient (2a w) and two temporaries, the clamped gate and its sigmoid
    (5a w)."""
    return {"swiglu": 3, "clamped_swiglu": 5}[k.kind] * a * k.width
