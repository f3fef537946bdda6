"""Compute kernels as the template runs them: GEMM throughput by shape and layout (operands cold
in cache), the causal attention kernels, the elementwise kernels' bandwidth and the LM head's
loss kernels per logit."""
import statistics
import time

import torch

from horizon_exec.device import bf16_gemm
from horizon_exec.measure.calibrate.timing import KernelTimer, median_time
from horizon_sim.schedule import work
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


GEMM_MAX_MNK = 2**30
"""Grid shapes with m*n*k above this are left out (their throughput has long saturated and
they would dominate the calibration's time); the table interpolates to them."""


def gemm_grid(quick: bool, device: str) -> list[tuple[int, int, int]]:
    if device == "cpu":
        dims = (128, 512) if quick else (128, 256, 512, 1024, 2048, 4096, 8192)
        cap = GEMM_MAX_MNK
    else:
        dims = (512, 4096) if quick else (512, 1024, 2048, 4096, 8192, 16384)
        cap = 2**40
    return [(m, n, k) for m in dims for n in dims for k in dims if m * n * k <= cap]


ADAPTER_RANKS = (8, 64)
"""The LoRA ranks whose skinny GEMMs the grid measures (work.adapter_gemms: one dimension the
rank): their rate per FLOP is far below a square GEMM's, and the table does not extrapolate to
them from its smallest square shapes (a rank-8 GEMM measured 3-5x slower than that on the EPYC
VM)."""


def adapter_grid(quick: bool, device: str) -> list[tuple[str, int, int, int]]:
    """(layout, m, n, k) of rank-r GEMMs in each layout, the rank as n, k or m in turn: the
    shapes work.adapter_gemms prices, at a few token counts and widths."""
    dims = ((512,) if quick else (512, 2048)) if device == "cpu" else ((4096,) if quick else (2048, 8192))
    ranks = ADAPTER_RANKS[:1] if quick else ADAPTER_RANKS
    return sorted({(lay, *shape) for lay in work.LAYOUTS for r in ranks for a in dims for b in dims
                   for shape in ((a, r, b), (a, b, r), (r, a, b))})


def model_gemms(model: ModelSpec, policy: Policy) -> set[tuple[str, int, int, int]]:
    """(layout, m, n, k) of every GEMM the model's compute ops run under the policy (its
    adapters' too)."""
    tok = policy.micro_batch * policy.seq
    gs = work.block_gemms(model, tok, True, policy) + work.head_gemms(model, tok, policy.loss_chunk_tokens)
    return {(g.layout, g.m, g.n, g.k) for g in gs}


class ColdOperands:
    """Operands of one GEMM shape taken round robin from a pool larger than the core's L2, so
    each call finds them the way a layer op does: weights just copied in by another core
    (in the shared cache at best), not in this core's private cache."""

    def __init__(self, layout, m, n, k, dtype, device, pool_bytes):
        per = (m * k + n * k) * torch.empty((), dtype=dtype).element_size()
        count = 1 if device != "cpu" else max(2, min(16, pool_bytes // max(per, 1) + 1))
        self.ops = []
        for _ in range(count):
            if layout == "nt":      # x . W^T: W stored (n, k)
                a, b = torch.ones(m, k, dtype=dtype, device=device), torch.ones(n, k, dtype=dtype, device=device).t()
            elif layout == "nn":    # dY . W: W stored (k, n)
                a, b = torch.ones(m, k, dtype=dtype, device=device), torch.ones(k, n, dtype=dtype, device=device)
            else:                   # X^T . dY: X stored (k, m)
                a, b = torch.ones(k, m, dtype=dtype, device=device).t(), torch.ones(k, n, dtype=dtype, device=device)
            self.ops.append((a, b))
        self.out = torch.empty(m, n, dtype=dtype, device=device)
        self.i = 0

    def __call__(self):
        a, b = self.ops[self.i % len(self.ops)]
        self.i += 1
        torch.mm(a, b, out=self.out)


GEMM_TIMED_S = 2e-3
"""Each shape is called until this much time is timed (at least GEMM_MIN_CALLS calls, at most
GEMM_MAX_CALLS) and the median call is its time. One or two calls, as before, measured the CPU
waking up rather than the kernel: on an AMX Xeon VM a 512 x 512 x 1024 bf16 GEMM timed alone
that way ran at 200-400 GFLOP/s against 900-1,000 called back to back, as a layer calls it, and
a grid visit's median moved 142 -> 577 between two visits (the table then said the machine had
'changed' by 1.66x during validation)."""
GEMM_MIN_CALLS, GEMM_MAX_CALLS = 3, 16


def gemm_times(shapes, dtype, device, sync=None, reverse: bool = False) -> dict:
    """{(layout, m, n, k): seconds of one call} over `shapes`, operands cold in cache: per shape
    one untimed call (the GEMM library picks and lays out its kernel; the core's matrix unit
    wakes), then the median of GEMM_MIN_CALLS.. calls (GEMM_TIMED_S)."""
    with bf16_gemm.scope(dtype, device):  # bf16 as a CPU run computes it (device/bf16_gemm.py)
        return _gemm_times(shapes, dtype, device, sync, reverse)


def _gemm_times(shapes, dtype, device, sync, reverse: bool) -> dict:
    pool = 8 * 2**20
    out = {}
    for shape in (reversed(shapes) if reverse else shapes):
        layout, m, n, k = shape
        fn = ColdOperands(layout, m, n, k, dtype, device, pool)
        fn()
        calls, timed = [], 0.0
        while len(calls) < GEMM_MIN_CALLS or (timed < GEMM_TIMED_S and len(calls) < GEMM_MAX_CALLS):
            if sync:
                sync()
            t0 = time.perf_counter()
            fn()
            if sync:
                sync()
            calls.append(time.perf_counter() - t0)
            timed += calls[-1]
        out[shape] = statistics.median(calls)
    return out


def gemm_rates(times: list[dict]) -> dict:
    """{shape: TFLOP/s} from the median time over visits (each a gemm_times result): a visit
    that ran while the machine was busy is outvoted, not averaged in."""
    return {s: 2.0 * s[1] * s[2] * s[3] / statistics.median(t[s] for t in times) / 1e12 for s in times[0]}


def visit_speeds(times: list[dict]) -> list[float]:
    """Each visit's speed (a gemm_times result) against the median visit's: per shape, the
    median time over visits over the visit's time; per visit, the median over shapes. Their
    spread says whether the machine held one speed while the grid was timed."""
    med = {s: statistics.median(t[s] for t in times) for s in times[0]}
    return [statistics.median(med[s] / t[s] for s in t) for t in times]


ATTENTION_HEAD_DIMS_CPU = (32, 64, 128)
"""The CPU grid's head dims: SDPA at head_dim 32 (the tiny preset's, 256 / 8 heads) runs 1.1-1.4x
slower per FLOP than at 64 on the AMX VM, and the table does not extrapolate below its
smallest: without 32 such a model's attention was priced at 64's rate."""


def attention_grid(quick: bool, device: str) -> list[tuple[int, int]]:
    seqs = (64, 256) if quick else ((64, 128, 256, 512, 1024) if device == "cpu" else (512, 1024, 2048, 4096, 8192))
    hds = (64,) if quick else (ATTENTION_HEAD_DIMS_CPU if device == "cpu" else (64, 128))
    return [(s, d) for s in seqs for d in hds]


def measure_attention(seq: int, hd: int, dtype, device, sync=None, heads: int = 8, kv_heads: int = 4,
                      reps: int = 3, masked: bool = False):
    """(forward, backward) TFLOP/s of the causal SDPA kernels as the template calls them (q, k
    rotated and v as strided (B, heads, T, hd) views of (B, T, heads, hd) projections; grouped
    kv heads), timed kernel by kernel, against the nominal FLOPs: forward 2 T^2 hd per head and
    sequence (the causal half of 4 T^2 hd), backward twice that. masked: the kernel under an
    explicit bool mask (sliding windows, document masks), against the full 4 T^2 hd."""
    fwd_only, fwd_bwd, nominal = attention_calls(seq, hd, dtype, device, heads, kv_heads,
                                                 1024 if device == "cpu" else 16384, masked)

    def once():
        with bf16_gemm.scope(dtype, device):  # bf16 as a CPU run computes it: the backward through fp32
            fwd_only()
            fwd_bwd()
    once()
    fwd, bwd = [], []
    for _ in range(reps):
        t = KernelTimer(sync)
        with t:
            once()
        fwd.append(t.time["attention_fwd"] / 2)
        bwd.append(t.time["attention_bwd"])
    return nominal / statistics.median(fwd) / 1e12, 2.0 * nominal / statistics.median(bwd) / 1e12


def attention_calls(seq: int, hd: int, dtype, device, heads: int, kv_heads: int, tokens: int,
                    masked: bool = False):
    """(forward, forward-with-grad + autograd.grad, nominal forward FLOPs) of the causal SDPA as
    the template calls it: q, k, v strided (B, heads, T, hd) views of (B, T, heads, hd)
    projections, grouped kv heads, `tokens` // seq sequences. masked: under an explicit bool
    mask as layers.attention_mask makes it (the kernel cannot skip tiles: the nominal count is
    the full 4 T^2 hd)."""
    import torch.nn.functional as F
    batch = max(1, tokens // seq)

    def heads_view(n):
        return torch.randn(batch, seq, n, hd, device=device).to(dtype).transpose(1, 2)
    q, k, v = heads_view(heads) * 1, heads_view(kv_heads) * 1, heads_view(kv_heads)
    go = torch.randn(batch, heads, seq, hd, device=device).to(dtype)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    from horizon_exec.model.layers import attention_mask
    mask = attention_mask(seq, max(1, seq // 4), None, device) if masked else None
    kw = dict(attn_mask=mask, is_causal=not masked, enable_gqa=True)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, **kw)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(qg, kg, vg, **kw)
        torch.autograd.grad(o, [qg, kg, vg], go)
    return fwd, fwd_bwd, 2.0 * batch * heads * seq * seq * hd * (2 if masked else 1)


def block_pass(model: ModelSpec, batch: int, seq: int, dtype, device):
    """fn() running one forward and one forward-with-grad + autograd.grad of the template block."""
    from horizon_exec.model.block import DecoderBlock
    from horizon_exec.model.layout import block_layout
    from horizon_exec.model.rope import rope_tables
    lay = block_layout(model)
    flat = (torch.randn(lay.numel, device=device) * 0.02).to(dtype)
    w = lay.views(flat)
    cos, sin = rope_tables(model, seq, dtype, device)
    x = torch.randn(batch, seq, model.hidden, device=device).to(dtype)
    blk = DecoderBlock(model)

    def fn():
        with bf16_gemm.scope(dtype, device):  # bf16 as a CPU run computes it; once a pass
            with torch.no_grad():
                blk(w, x, cos, sin)
            with torch.enable_grad():
                xg = x.detach().requires_grad_()
                wp = {k: v.detach().requires_grad_() for k, v in w.items()}
                y = blk(wp, xg, cos, sin)
                torch.autograd.grad(y, [xg, *wp.values()], x)
    return fn


def measure_loss_ns_per_logit(vocab: int = 8192, chunk: int = 256, dtype=torch.bfloat16, device="cpu",
                              sync=None, reps: int = 5, kernel: str = "torch") -> float:
    """Nanoseconds per logit of the loss of one LM-head chunk and its gradient, less the head's
    GEMMs: the function head.head_fwd_bwd calls per chunk (xent.loss_and_grad_), with the
    given loss kernel. Each rep runs on a fresh copy of the GEMM's output (the fused kernel
    overwrites it); the copy's own time is measured alone and taken off."""
    from horizon_exec.model.xent import loss_and_grad_
    mm_out = torch.randn(chunk, vocab, device=device).to(dtype)
    labels = torch.randint(0, vocab, (chunk,), device=device)
    labels[-1] = -100
    copy_s = median_time(lambda: mm_out.clone(), min_s=0.02, min_reps=reps, sync=sync)
    loss_s = median_time(lambda: loss_and_grad_(mm_out.clone(), labels, 1e-3, kernel), min_s=0.02, min_reps=reps,
                         sync=sync)
    return max(loss_s - copy_s, 0.0) / (chunk * vocab) * 1e9


def measure_dequant_ns(numel: int, device="cpu", sync=None, reps: int = 3) -> tuple[tuple[str, float], ...]:
    """dequant_ns_per_param: nanoseconds per parameter of the executor's dequantization of a
    quantized base (model/quant.py), each format, into bf16, on a (numel // 4096, 4096) matrix
    (at least a chunk's worth on a GPU, where launches would dominate a small one)."""
    from horizon_exec.model import quant as Q
    w = torch.randn(max(1, numel // 4096), 4096, device=device) * 0.02
    out = torch.empty(w.numel(), dtype=torch.bfloat16, device=device)
    rows = []
    for fmt, quantize, run in (("nf4", Q.nf4_quantize, Q.nf4_dequantize_),
                               ("int8", Q.int8_quantize, lambda o, r: Q.int8_dequantize_(o, r, 4096))):
        r = quantize(w)
        rows.append((fmt, median_time(lambda: run(out, r), min_s=0.02, min_reps=reps, sync=sync) / w.numel() * 1e9))
    return tuple(rows)


def measure_cpu_loss_figures(vocab: int, run) -> tuple[float, float]:
    """(loss_ns_per_logit, fused_loss_ns_per_logit) on the CPU, each measured through `run`
    (a lane wrapper: run(fn) -> fn()); the fused figure 0.0 where that kernel cannot be built."""
    from horizon_exec.model.xent import fused_unavailable
    torch_ns = run(lambda: measure_loss_ns_per_logit(vocab, kernel="torch"))
    return torch_ns, 0.0 if fused_unavailable("cpu") else run(lambda: measure_loss_ns_per_logit(vocab, kernel="fused"))


ELEMENTWISE_MODEL = ModelSpec(name="calibrate-block", n_layers=1, hidden=512, n_heads=8, n_kv_heads=4,
                              ffn_hidden=1376, vocab=256)


def measure_elementwise(dtype, device, quick: bool, sync=None, sizes=None) -> list[tuple[float, int]]:
    """(seconds, bytes) of the template block's elementwise kernels at a small and a large
    token count, medians of repeats: the slope is their bandwidth, with the per-kernel
    dispatch cost (the same at both sizes, and part of the op overheads) left out. `sizes`:
    the two (batch, seq); by default the CPU's (a GPU needs ones large enough that each
    kernel's bytes outweigh its launch, see calibrate/cuda.py)."""
    out = []
    for batch, seq in sizes or ((1, 64), (1, 256) if quick else (4, 256)):
        fn = block_pass(ELEMENTWISE_MODEL, batch, seq, dtype, device)
        fn()
        runs = []
        for _ in range(3 if quick else 5):
            t = KernelTimer(sync)
            with t:
                fn()
            runs.append((t.time["elementwise"], t.bytes))
        out.append((statistics.median(r[0] for r in runs), runs[0][1]))
    return out


def slope_GBps(points) -> float:
    """Bytes/s from [(seconds, bytes) small, (seconds, bytes) large] (mean times over rounds)."""
    (t1, b1), (t2, b2) = points
    return (b2 - b1) / (t2 - t1) / 1e9 if t2 > t1 else b2 / t2 / 1e9


def gemm_shapes(quick, device, model, policy):
    """(layout, m, n, k) to time: the grid for `device`, plus the model's own GEMMs when a model is given."""
    extra = model_gemms(model, policy or Policy()) if model is not None else set()
    return sorted({(l, *s) for l in work.LAYOUTS for s in gemm_grid(quick, device)} | extra)


def fp32_gemm_shapes(quick: bool, device: str) -> list[tuple[str, int, int, int]]:
    """The fp32 shapes to time: the small grid (an fp32 step's GEMMs are priced from it, scaled
    where the bf16 grid is wider) and the adapters' rank-r GEMMs, which run in fp32."""
    return sorted({(l, *s) for l in work.LAYOUTS for s in gemm_grid(True, device)} | set(adapter_grid(quick, device)))
