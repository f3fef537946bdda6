"""`horizon calibrate`: measure the machine this runs on, for the executor's backend, and return
a HardwareSpec the planner can simulate with (saved as TOML by the CLI).

CPU backend (the "device" is the compute lane's own core(s); the copy and optimizer lanes are
threads sharing the remaining core(s)). Each figure is measured in a thread set up exactly like
the lane that will do the work (same cores, same intra-op thread count):
  gemm_TFLOPs         torch.mm throughput by shape (a log-spaced grid, plus a model's exact
                      shapes when given) and layout (x.W^T, dY.W, X^T.dY), bf16 and fp32, with
                      operands cold in the core's cache as a layer op finds its weights
  attention_TFLOPs    the causal SDPA forward and backward kernels, timed kernel by kernel as
                      the template calls them (strided heads, grouped kv), by (seq, head_dim)
  hbm_GBps            bandwidth of the template's own elementwise kernels (norms, RoPE, SiLU,
                      casts, residuals): the slope of their kernel time over the bytes they
                      move between a small and a large token count, so the per-kernel dispatch
                      cost stays in the op overheads and is not counted twice
  loss_ns_per_logit   the LM head's loss kernels (fp32 upcast, logsumexp, gather, softmax
                      gradient in place, cast back) per logit: exp/log-bound, not bandwidth
  reduce_GBps         an offload's squared-norm pass over a gradient, as it runs in place (the
                      offloads of the in-place run below, beyond their copy)
  op_overhead_us      fixed cost per compute op kind: a tiny model trained with its ops
                      serialized (no lane overlap), each op's time less its modelled work;
                      head_chunk from the tiny head with eight loss chunks against one
  h2d/d2h_GBps        one copy thread's rate for layer-sized copies from (to) buffers that are
                      cold in cache, as load_weights (offload_grads) see them; latency_us: the
                      copy ops' fixed cost in the tiny serialized run
  busy_latency_us     what a copy (LinkSpec) or a CPU-lane op (HostSpec) costs extra when it
                      runs next to a busy compute lane: a small model trained normally, each
                      such op's time less its modelled time alone
  lane_cores          how many cores' worth of copies k threads get on the host-lane cores
                      together (k = 2 x those cores): 1.0 per core means perfect time sharing
  adam_Gparams_per_s  the executor's AdamW op (bf16 grads widened in chunks, fp32 master and
                      moments, bf16 working copy refreshed) on cold units with warm grads
  thread_GBps         one host thread accumulating bf16 grads into cold fp32 host grads
  dram_GBps           all cores copying at once (the bus)
  runtime_overhead    RSS of a training process before model tensors: a tiny model trained in
                      a fresh process (probe.py), less its tensors and allocator retention
The noise-prone figures are measured in `rounds` rounds spread over the run (the GEMM grid is
visited once per round, in alternating order) and averaged on time: a shared machine's speed
drifts by tens of percent over seconds. The slowdown a busy host lane causes on the compute
core is measured and printed, not modelled.
CUDA backend: pinned and pageable h2d/d2h bandwidth and latency, GEMM throughput by shape,
attention, elementwise bandwidth, per-op overheads (the same tiny serialized run), AdamW with
all host cores, RAM and runtime overhead. Written for a GPU box; not exercised on the machine
this was developed on (no GPU there).

`quick=True` shrinks every grid and does one round (for tests).
"""
import os
import statistics
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Lane, OpKind, build_schedule
from horizon_sim.schedule import work
from horizon_sim.sim.costs import CostModel
from horizon_sim.sim.process_rss import allocator_retention_bytes, largest_transient_block
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB

# The tiny model whose serialized ops give the fixed per-op costs: every kernel of the
# template runs, on shapes so small that the work is microseconds.
TINY = ModelSpec(name="calibrate-tiny", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2,
                 ffn_hidden=128, vocab=64)
TINY_POLICY = Policy(batch=1, seq=16, ckpt_every=2, slots=2, optimizer="pipelined")


# ---- timing helpers -------------------------------------------------------------------------
def _median_time(fn, *, min_s: float = 0.02, max_reps: int = 50, min_reps: int = 3, sync=None) -> float:
    """Median seconds of fn() over enough repeats to fill ~min_s (after one warm-up call)."""
    fn()
    if sync:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    est = max(time.perf_counter() - t0, 1e-7)
    reps = int(min(max_reps, max(min_reps, min_s / est)))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _in_lane(backend, lane: Lane, fn):
    """Run fn() in a fresh thread set up like the executor's `lane` worker; return its result."""
    out = {}

    def body():
        try:
            backend.start_lane(lane)
            out["v"] = fn()
        except BaseException as e:  # re-raised in the caller
            out["e"] = e

    t = threading.Thread(target=body, name=f"calibrate-{lane.value}")
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]
    return out["v"]


@dataclass
class Progress:
    """Numbered progress lines on `say` (print by default), with the time each part took."""
    total: int
    say: object = print
    n: int = 0
    t0: float = 0.0

    def step(self, what: str) -> None:
        self.done()
        self.n += 1
        self.t0 = time.perf_counter()
        if self.say:
            self.say(f"calibrate [{self.n}/{self.total}] {what} ...")

    def done(self, note: str = "") -> None:
        if self.t0 and self.say:
            self.say(f"    {time.perf_counter() - self.t0:.1f} s{'; ' + note if note else ''}")
        self.t0 = 0.0


# ---- GEMMs, attention, elementwise ------------------------------------------------------------
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


def model_gemms(model: ModelSpec, policy: Policy) -> set[tuple[str, int, int, int]]:
    """(layout, m, n, k) of every GEMM the model's compute ops run under the policy."""
    tok = policy.micro_batch * policy.seq
    gs = work.block_gemms(model, tok, True) + work.head_gemms(model, tok, policy.loss_chunk_tokens)
    return {(g.layout, g.m, g.n, g.k) for g in gs}


class _ColdOperands:
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


def gemm_times(shapes, dtype, device, sync=None, reverse: bool = False, warm: bool = True) -> dict:
    """{(layout, m, n, k): seconds of one call} over `shapes`, operands cold in cache; one
    warm-up call per shape first when `warm` (the GEMM library picks and lays out its kernel),
    two timed calls for small shapes, one for large."""
    pool = 8 * 2**20
    out = {}
    for shape in (reversed(shapes) if reverse else shapes):
        layout, m, n, k = shape
        fn = _ColdOperands(layout, m, n, k, dtype, device, pool)
        if warm:
            fn()
        reps = 2 if m * n * k < 2**27 else 1
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        if sync:
            sync()
        out[shape] = (time.perf_counter() - t0) / reps
    return out


def gemm_rates(times: list[dict]) -> dict:
    """{shape: TFLOP/s} from the mean time over visits (each a gemm_times result)."""
    return {s: 2.0 * s[1] * s[2] * s[3] / statistics.mean(t[s] for t in times) / 1e12 for s in times[0]}


def measure_gemm_table(shapes, dtype, device, sync=None, visits: int = 2) -> dict:
    """{shape: TFLOP/s}: each shape visited `visits` times in alternating order (so a slow
    spell of the machine does not hit one region of the grid only); rate from the mean time."""
    return gemm_rates([gemm_times(shapes, dtype, device, sync, reverse=v % 2 == 1, warm=v == 0)
                       for v in range(visits)])


def attention_grid(quick: bool, device: str) -> list[tuple[int, int]]:
    seqs = (64, 256) if quick else ((64, 128, 256, 512, 1024) if device == "cpu" else (512, 1024, 2048, 4096, 8192))
    hds = (64,) if quick else (64, 128)
    return [(s, d) for s in seqs for d in hds]


class KernelTimer:
    """A dispatch mode that times each aten kernel and sorts it into GEMM, attention forward,
    attention backward, view (no data movement) or elementwise; elementwise bytes are what
    each kernel's tensor arguments and outputs hold (read plus write)."""

    GEMM = ("aten.mm", "aten.addmm", "aten.bmm")

    def __new__(cls, sync=None):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        class _Mode(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.time = {"gemm": 0.0, "attention_fwd": 0.0, "attention_bwd": 0.0, "elementwise": 0.0}
                self.bytes = 0
                self.kernels = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                sch = func._schema
                write = any(a.alias_info is not None and a.alias_info.is_write for a in sch.arguments)
                view = (not write and sch.returns and all(r.alias_info is not None for r in sch.returns)) \
                    or name.startswith("aten._unsafe_view")
                t0 = time.perf_counter()
                out = func(*args, **(kwargs or {}))
                if sync:
                    sync()
                dt = time.perf_counter() - t0
                if view:
                    return out
                self.kernels += 1
                if name.startswith(KernelTimer.GEMM):
                    self.time["gemm"] += dt
                elif "attention" in name:
                    self.time["attention_bwd" if "backward" in name else "attention_fwd"] += dt
                else:
                    self.time["elementwise"] += dt
                    self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                                      if isinstance(t, torch.Tensor))
                return out

        return _Mode()


def measure_attention(seq: int, hd: int, dtype, device, sync=None, heads: int = 8, kv_heads: int = 4,
                      reps: int = 3):
    """(forward, backward) TFLOP/s of the causal SDPA kernels as the template calls them (q, k
    rotated and v as strided (B, heads, T, hd) views of (B, T, heads, hd) projections; grouped
    kv heads), timed kernel by kernel, against the nominal FLOPs: forward 2 T^2 hd per head and
    sequence (the causal half of 4 T^2 hd), backward twice that."""
    import torch.nn.functional as F
    batch = max(1, (1024 if device == "cpu" else 16384) // seq)

    def heads_view(n):
        return torch.randn(batch, seq, n, hd, device=device).to(dtype).transpose(1, 2)
    q, k, v = heads_view(heads) * 1, heads_view(kv_heads) * 1, heads_view(kv_heads)
    go = torch.randn(batch, heads, seq, hd, device=device).to(dtype)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def once():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True)
        torch.autograd.grad(o, [qg, kg, vg], go)
    once()
    fwd, bwd = [], []
    for _ in range(reps):
        t = KernelTimer(sync)
        with t:
            once()
        fwd.append(t.time["attention_fwd"] / 2)
        bwd.append(t.time["attention_bwd"])
    nominal = 2.0 * batch * heads * seq * seq * hd
    return nominal / statistics.median(fwd) / 1e12, 2.0 * nominal / statistics.median(bwd) / 1e12


def _block_pass(model: ModelSpec, batch: int, seq: int, dtype, device):
    """fn() running one forward and one forward-with-grad + autograd.grad of the template block."""
    from horizon_exec.layers import DecoderBlock, rope_tables
    from horizon_exec.layout import block_layout
    lay = block_layout(model)
    flat = (torch.randn(lay.numel, device=device) * 0.02).to(dtype)
    w = lay.views(flat)
    cos, sin = rope_tables(model, seq, dtype, device)
    x = torch.randn(batch, seq, model.hidden, device=device).to(dtype)
    blk = DecoderBlock(model)

    def fn():
        with torch.no_grad():
            blk(w, x, cos, sin)
        with torch.enable_grad():
            xg = x.detach().requires_grad_()
            wp = {k: v.detach().requires_grad_() for k, v in w.items()}
            y = blk(wp, xg, cos, sin)
            torch.autograd.grad(y, [xg, *wp.values()], x)
    return fn


def measure_loss_ns_per_logit(vocab: int = 8192, chunk: int = 256, dtype=torch.bfloat16, device="cpu",
                              sync=None, reps: int = 5) -> float:
    """Nanoseconds per logit of the loss kernels of one LM-head chunk, the same kernels in the
    same order as head.head_fwd_bwd's chunk loop less its two GEMMs: fp32 upcast, logsumexp,
    target gather, masked loss, the softmax gradient in place, cast back."""
    mm_out = torch.randn(chunk, vocab, device=device).to(dtype)
    labels = torch.randint(0, vocab, (chunk,), device=device)
    labels[-1] = -100

    def once():
        logits = mm_out.float()
        valid = labels != -100
        safe = torch.where(valid, labels, 0)
        lse = torch.logsumexp(logits, dim=-1)
        tgt = logits.gather(1, safe[:, None]).squeeze(1)
        torch.where(valid, lse - tgt, 0.0).sum()
        p = logits.sub_(lse[:, None]).exp_()
        p[torch.arange(chunk, device=device), safe] -= valid.to(p.dtype)
        p.mul_((valid.to(p.dtype) * 1e-3)[:, None])
        p.to(dtype)
    return _median_time(once, min_s=0.02, min_reps=reps, sync=sync) / (chunk * vocab) * 1e9


ELEMENTWISE_MODEL = ModelSpec(name="calibrate-block", n_layers=1, hidden=512, n_heads=8, n_kv_heads=4,
                              ffn_hidden=1376, vocab=256)


def measure_elementwise(dtype, device, quick: bool, sync=None) -> tuple[float, float]:
    """(seconds, bytes) of the template block's elementwise kernels at a small and a large
    token count, medians of repeats: the slope is their bandwidth, with the per-kernel
    dispatch cost (the same at both sizes, and part of the op overheads) left out."""
    out = []
    for batch, seq in ((1, 64), (2, 256) if quick else (4, 256)):
        fn = _block_pass(ELEMENTWISE_MODEL, batch, seq, dtype, device)
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


# ---- host side ---------------------------------------------------------------------------------
def _cold_pool(nbytes: int, dtype=torch.bfloat16, pool_bytes: int = 96 * 2**20):
    """Buffers of nbytes whose total exceeds the last-level cache, used round robin so each
    use finds its buffer cold."""
    n = max(2, pool_bytes // max(nbytes, 1))
    numel = nbytes // torch.empty((), dtype=dtype).element_size()
    return [torch.ones(numel, dtype=dtype) for _ in range(n)]


def measure_copy_GBps(nbytes: int, direction: str) -> float:
    """One thread's copy rate for an nbytes buffer: h2d reads a cold source into a warm
    destination (load_weights: host store -> slot), d2h a warm source into a cold one."""
    pool = _cold_pool(nbytes)
    warm = torch.empty_like(pool[0])
    it = iter(range(10**9))

    def one():
        b = pool[next(it) % len(pool)]
        if direction == "h2d":
            warm.copy_(b)
        else:
            b.copy_(warm)
    return nbytes / _median_time(one, min_s=0.03) / 1e9


def measure_reduce_GBps(nbytes: int) -> float:
    """An offload's squared-norm pass (torch.linalg.vector_norm into fp32) over a bf16
    gradient, as the copy lane does it: gradients cold in this core's cache, the pass's fp32
    temporary served the way glibc serves it after warm-up."""
    pool = _cold_pool(nbytes, pool_bytes=48 * 2**20)
    it = iter(range(10**9))

    def one():
        torch.linalg.vector_norm(pool[next(it) % len(pool)], dtype=torch.float32).square()
    for _ in range(3):
        one()
    return nbytes / _median_time(one, min_s=0.03) / 1e9


def measure_accumulate_GBps(n_params: int) -> float:
    """One host thread accumulating a bf16 gradient into a cold fp32 host gradient (what an
    offload does with micro-batches), in the bytes the schedule counts for it: 8 per
    parameter (read and write the fp32 sum)."""
    dsts = [torch.zeros(n_params) for _ in range(max(2, (64 * 2**20) // (4 * n_params)))]
    src = torch.ones(n_params, dtype=torch.bfloat16)
    it = iter(range(10**9))
    return 8 * n_params / _median_time(lambda: dsts[next(it) % len(dsts)].add_(src), min_s=0.03) / 1e9


def measure_adam_Gparams(n_params: int, quick: bool) -> float:
    """Parameters/s of the executor's AdamW op (bf16 grads widened in chunks, fp32 master and
    moments, bf16 working copy refreshed). As in a step, the unit's master, moments and working
    copy are cold (several units round robin) and its gradient is warm (the copy lane has just
    written it)."""
    from horizon_exec.optim import AdamW
    opt = AdamW()
    units = []
    for _ in range(2 if quick else 4):
        units.append((torch.zeros(n_params), torch.zeros(n_params), torch.zeros(n_params), torch.zeros(()),
                      torch.empty(n_params, dtype=torch.bfloat16)))
    grad = torch.full((n_params,), 1e-3, dtype=torch.bfloat16)
    fresh = torch.full((n_params,), 2e-3, dtype=torch.bfloat16)
    scratch = torch.empty(opt.chunk_params)
    ts = []
    for i in range(6 if quick else 12):
        p, m, v, st, wc = units[i % len(units)]
        grad.copy_(fresh)
        t0 = time.perf_counter()
        opt.step(p, grad, m, v, st, 1.0, working_copy=wc, scratch=scratch)
        ts.append(time.perf_counter() - t0)
    return n_params / statistics.median(ts[1:]) / 1e9


def measure_shared_cores(backend, nbytes: int, threads: int) -> float:
    """Cores' worth of copy work `threads` threads on the host-lane cores get together: their
    aggregate rate over one thread's rate."""
    src = [torch.ones(nbytes // 2, dtype=torch.bfloat16) for _ in range(threads)]
    dst = [torch.empty_like(s) for s in src]
    reps = max(5, int(0.1 / max(nbytes / 20e9, 1e-6)))

    def loop(i, out):
        backend.start_lane(Lane.H2D)
        t0 = time.perf_counter()
        for _ in range(reps):
            dst[i].copy_(src[i])
        out[i] = time.perf_counter() - t0

    one: dict = {}
    t = threading.Thread(target=loop, args=(0, one))
    t.start()
    t.join()
    together: dict = {}
    ts = [threading.Thread(target=loop, args=(i, together)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(reps / together[i] for i in range(threads)) / (reps / one[0])


def measure_bus_GBps(nbytes: int, cores: list[int]) -> float:
    """All cores copying large buffers at once: the DRAM bus, bytes moved per second."""
    src = [torch.ones(nbytes // 2, dtype=torch.bfloat16) for _ in cores]
    dst = [torch.empty_like(s) for s in src]
    reps = 5
    done: dict = {}
    barrier = threading.Barrier(len(cores))

    def loop(i, core):
        try:
            os.sched_setaffinity(0, [core])
        except (OSError, AttributeError):
            pass
        torch.set_num_threads(1)
        dst[i].copy_(src[i])
        barrier.wait()
        t0 = time.perf_counter()
        for _ in range(reps):
            dst[i].copy_(src[i])
        done[i] = time.perf_counter() - t0

    ts = [threading.Thread(target=loop, args=(i, c)) for i, c in enumerate(cores)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(reps * nbytes / done[i] for i in done) / 1e9


CONTENTION_MODEL = ModelSpec(name="calibrate-contention", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2,
                             ffn_hidden=688, vocab=256)
CONTENTION_POLICY = Policy(batch=2, seq=128)


def busy_latencies(hw: HardwareSpec, device: str, steps: int) -> tuple[float, float, float]:
    """How much longer copies and CPU-lane ops take when they run next to the compute lane:
    a small model trained normally (lanes overlapping), and for each plain copy or CPU-lane op
    that started while a compute op ran, its measured time less what `hw` predicts for it
    alone. Returns (mean extra µs of a copy, of a CPU-lane op, and the offloads' squared-norm
    pass in GB/s: what an offload takes beyond its copy and that extra). On the CPU backend the
    extra is the thread waiting for the interpreter lock and the arena's lock, which the compute
    lane's kernel dispatch and memory tracking keep taking, and sharing the cache; the norm
    pass's fp32 temporary is served as the executor's allocator state serves it."""
    from horizon_exec.trainer import Trainer
    sched = build_schedule(CONTENTION_MODEL, CONTENTION_POLICY)
    costs = CostModel(hw, CONTENTION_POLICY.compute_dtype, sched.meta)
    gen = torch.Generator().manual_seed(0)
    extra: dict = {"copy": [], "cpu": []}
    offloads = []  # (link bytes, measured s, copy part alone s)
    with Trainer(CONTENTION_MODEL, CONTENTION_POLICY, device=device) as tr:
        for i in range(steps + 1):
            tl = tr.step(torch.randint(0, CONTENTION_MODEL.vocab, (CONTENTION_POLICY.batch, CONTENTION_POLICY.seq),
                                       generator=gen)).timeline
            if not i:
                continue
            comp = tl[tl.lane == Lane.COMPUTE.value]
            for r in tl[tl.lane != Lane.COMPUTE.value].itertuples():
                if not ((comp.start_s <= r.start_s) & (comp.end_s > r.start_s)).any():
                    continue
                op = sched.ops[int(r.op_id)]
                if op.kind == OpKind.OFFLOAD_GRADS and not op.host_bytes:
                    copy = costs.flows(op)[0]
                    offloads.append((op.link_bytes, r.dur_s, copy.latency_s + copy.nbytes / copy.cap_Bps))
                    continue
                extra["cpu" if op.lane == Lane.CPU else "copy"].append(r.dur_s - costs.alone_s(op))
    copy_us, cpu_us = (max(0.0, statistics.mean(extra[k]) * 1e6) if extra[k] else 0.0 for k in ("copy", "cpu"))
    red_s = sum(max(t - c - copy_us * 1e-6, 1e-6) for _, t, c in offloads)
    reduce = sum(b for b, _, _ in offloads) / red_s / 1e9 if offloads else 0.0
    return copy_us, cpu_us, reduce


def compute_slowdown(backend, quick: bool) -> float:
    """Time of the template block (forward and backward, temporaries tracked) on the compute
    lane while a host-lane thread copies without pause, over its time alone."""
    from horizon_exec.arena import DeviceArena
    from horizon_exec.memtrack import TransientTracker
    arena = DeviceArena(backend)
    block = _block_pass(ELEMENTWISE_MODEL, 2, 256, torch.bfloat16, "cpu")
    pool = _cold_pool(2**20, pool_bytes=48 * 2**20)
    dst = torch.empty_like(pool[0])

    def timed(n):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            with TransientTracker(arena):
                block()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def copier(stop):
        backend.start_lane(Lane.H2D)
        i = 0
        while not stop.is_set():
            dst.copy_(pool[i % len(pool)])
            i += 1

    n = 3 if quick else 6
    alone = _in_lane(backend, Lane.COMPUTE, lambda: timed(n))
    stop = threading.Event()
    t = threading.Thread(target=copier, args=(stop,))
    t.start()
    loaded = _in_lane(backend, Lane.COMPUTE, lambda: timed(n))
    stop.set()
    t.join()
    return loaded / alone


def ram_GiB() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GiB
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB


def _mem_in_use_GiB() -> float:
    try:
        info = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in Path("/proc/meminfo").read_text().splitlines()}
        return (info["MemTotal"] - info["MemAvailable"]) / GiB
    except (OSError, KeyError, ValueError):
        return 1.0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "cpu"


# ---- fixed per-op costs: a tiny model, ops serialized -------------------------------------------
class TinyProbe:
    """The tiny model trained in this process with its ops serialized (one op at a time across
    lanes, so each time is the op's own cost). The trainer stays up for the whole calibration
    and `sample()` runs a few steps at many points of it, so the Python-bound fixed costs, the
    noisiest figures on a shared machine, are averaged over the whole run."""

    def __init__(self, device: str, policy: Policy = TINY_POLICY):
        from horizon_exec.probe import _Serialized, _sync_for
        from horizon_exec.trainer import Trainer
        self.policy = policy
        self.gen = torch.Generator().manual_seed(0)
        self.tr = Trainer(TINY, policy, device=device)
        self.ser = _Serialized(self.tr.engine.runner, _sync_for(device))
        self.tr.engine.runner = self.ser
        self.own: dict[int, list[float]] = {}
        self._step()  # warm-up, not kept

    def _step(self) -> dict:
        self.ser.durations.clear()
        self.tr.step(torch.randint(0, TINY.vocab, (self.policy.batch, self.policy.seq), generator=self.gen))
        return dict(self.ser.durations)

    def sample(self, steps: int = 1) -> None:
        for _ in range(steps):
            for op_id, t in self._step().items():
                self.own.setdefault(op_id, []).append(t)

    def close(self) -> None:
        self.tr.close()


def tiny_op_times(device: str, steps: int, policy: Policy = TINY_POLICY) -> dict[int, list[float]]:
    """{op id: own seconds per step} of `steps` serialized steps of the tiny model."""
    probe = TinyProbe(device, policy)
    try:
        probe.sample(steps)
    finally:
        probe.close()
    return probe.own


COPY_KINDS = (OpKind.LOAD_WEIGHTS, OpKind.LOAD_CKPT, OpKind.SAVE_CKPT, OpKind.LOAD_INPUT,
              OpKind.OFFLOAD_GRADS, OpKind.OFFLOAD_INPUT_GRAD)
COMPUTE_KINDS = (OpKind.FORWARD, OpKind.RECOMPUTE, OpKind.BACKWARD, OpKind.HEAD)


def op_overheads(hw: HardwareSpec, own: dict[int, list[float]], policy: Policy = TINY_POLICY):
    """Each op's own time (mean over steps) less the work `hw` predicts for it, by kind:
    (compute kind -> µs, copy latency µs, CPU-lane latency µs from the global-norm op, which
    does no work to speak of)."""
    sched = build_schedule(TINY, policy)
    costs = CostModel(hw, policy.compute_dtype, sched.meta)
    by_kind: dict[OpKind, list[float]] = {}
    for op in sched.ops:
        if op.id not in own:
            continue
        t = statistics.mean(own[op.id])
        if op.lane == Lane.COMPUTE:
            terms = costs.compute_terms(op)
            t -= terms["gemm"] + terms["attention"] + terms["elementwise"]
        else:
            t -= sum(f.nbytes / f.cap_Bps for f in costs.flows(op))
        by_kind.setdefault(op.kind, []).append(max(t, 0.0))
    compute = {k.value: statistics.mean(v) * 1e6 for k, v in by_kind.items() if k in COMPUTE_KINDS}
    copies = [x for k in COPY_KINDS for x in by_kind.get(k, [])]
    return compute, statistics.median(copies) * 1e6, statistics.median(by_kind[OpKind.GRAD_NORM]) * 1e6


def head_id(policy: Policy) -> int:
    return next(o.id for o in build_schedule(TINY, policy).ops if o.kind == OpKind.HEAD)


HEAD8_POLICY = replace(TINY_POLICY, loss_chunk_tokens=TINY_POLICY.seq // 8)
"""The tiny model with eight loss chunks: its head against TINY_POLICY's gives 'head_chunk'."""


def runtime_overhead_GiB(probe_result: dict) -> float:
    """RSS of the tiny probe less its model tensors (store, device peak, dynamic host buffers,
    all in RAM on the CPU backend) and the allocator's retention for its largest block."""
    dev = max(s["device_peak_bytes"] for s in probe_result["steps"])
    rest = (probe_result["rss_peak_bytes"] - probe_result["store_bytes"] - dev
            - probe_result["host_dynamic_peak_bytes"]
            - allocator_retention_bytes(largest_transient_block(TINY, TINY_POLICY)))
    return max(rest, 0) / GiB


# ---- the whole calibration --------------------------------------------------------------------
def calibrate(device: str = "cpu", *, quick: bool = False, model: ModelSpec | None = None,
              policy: Policy | None = None, say=print, rounds: int | None = None) -> HardwareSpec:
    """Measure this machine for the executor on `device` ('cpu' or 'cuda[:N]'). `model` and
    `policy` add their exact GEMM shapes to the table. `say`: progress lines (None: quiet).
    `rounds`: how many times the cheap, noise-prone measurements (attention, elementwise,
    per-op costs, copies, AdamW) are repeated, spread over the run (default 3, quick 1); each
    figure is the mean over rounds of its time."""
    rounds = rounds or (1 if quick else 3)
    if device == "cpu":
        return _calibrate_cpu(quick, model, policy, say, rounds)
    if device.startswith("cuda"):
        return _calibrate_cuda(device, quick, model, policy, say, rounds)
    raise HorizonError(f"device {device!r}: calibrate measures 'cpu' or 'cuda[:N]'")


def _gemm_shapes(quick, device, model, policy):
    extra = model_gemms(model, policy or Policy()) if model is not None else set()
    return sorted({(l, *s) for l in work.LAYOUTS for s in gemm_grid(quick, device)} | extra)


def _mean_rate(rates) -> float:
    """Mean over rounds taken on times (the harmonic mean of rates): the machine's average."""
    return len(rates) / sum(1.0 / r for r in rates)


def _calibrate_cpu(quick, model, policy, say, rounds) -> HardwareSpec:
    from horizon_exec.backend_cpu import CpuBackend
    from horizon_exec.probe import probe
    t_start = time.perf_counter()
    be = CpuBackend()
    prog = Progress(total=4 + rounds, say=say)
    compute = lambda fn: _in_lane(be, Lane.COMPUTE, fn)  # noqa: E731
    host = lambda fn: _in_lane(be, Lane.CPU, fn)         # noqa: E731

    shapes = _gemm_shapes(quick, "cpu", model, policy)
    fp32_shapes = [(l, *s) for l in work.LAYOUTS for s in gemm_grid(True, "cpu")]
    prog.step(f"GEMM library warm-up: {len(shapes)} bf16 shapes, {len(fp32_shapes)} fp32 on "
              f"{be.compute_threads} thread(s) of core(s) {be.compute_cores}")
    gemm_visits = [compute(lambda: gemm_times(shapes, torch.bfloat16, "cpu"))]  # warm, and a first visit
    fp32_visits = [compute(lambda: gemm_times(fp32_shapes, torch.float32, "cpu"))]

    ram = ram_GiB()
    tiny = [TinyProbe("cpu"), TinyProbe("cpu", HEAD8_POLICY)]

    def sample_tiny():
        for t in tiny:
            t.sample(1)
    sample_tiny()
    attn_pts = attention_grid(quick, "cpu")
    R: dict = {"attn": {p: [] for p in attn_pts}, "elem": [], "h2d": [], "d2h": [], "thread": [],
               "reduce": [], "adam": [], "slowdown": [], "loss": []}
    layer_bytes = 4 * 2**20 if not quick else 2**20
    hw = None
    for r in range(rounds):
        prog.step(f"round {r + 1}/{rounds}: GEMM grid (cold operands), attention kernels, elementwise "
                  "bandwidth, copies, AdamW, per-op fixed costs (a tiny model, ops serialized)")
        sample_tiny()
        if not quick:  # one more visit of the grid per round, alternating direction
            gemm_visits.append(compute(lambda: gemm_times(shapes, torch.bfloat16, "cpu", reverse=r % 2 == 0,
                                                          warm=False)))
            sample_tiny()
        for seq, hd in attn_pts:
            R["attn"][(seq, hd)].append(compute(lambda: measure_attention(seq, hd, torch.bfloat16, "cpu")))
        sample_tiny()
        R["elem"].append(compute(lambda: measure_elementwise(torch.bfloat16, "cpu", quick)))
        R["loss"].append(compute(lambda: measure_loss_ns_per_logit(2048 if quick else 8192)))
        R["h2d"].append(host(lambda: measure_copy_GBps(layer_bytes, "h2d")))
        R["d2h"].append(host(lambda: measure_copy_GBps(layer_bytes, "d2h")))
        R["thread"].append(host(lambda: measure_accumulate_GBps(layer_bytes // 2)))
        R["reduce"].append(host(lambda: measure_reduce_GBps(layer_bytes // 2)))
        R["adam"].append(host(lambda: measure_adam_Gparams(2**21 if not quick else 2**19, quick)))
        sample_tiny()
        R["slowdown"].append(compute_slowdown(be, quick))
        elem = [(statistics.mean(x[i][0] for x in R["elem"]), R["elem"][0][i][1]) for i in (0, 1)]
        g = gemm_rates(gemm_visits[-1:])
        prog.done(f"GEMM median {statistics.median(g.values()) * 1e3:.0f} GFLOP/s, elementwise "
                  f"{slope_GBps(elem):.1f} GB/s, h2d {R['h2d'][-1]:.1f} GB/s, AdamW {R['adam'][-1]:.2f} G params/s")
    bf16, fp32 = gemm_rates(gemm_visits[1:] or gemm_visits), gemm_rates(fp32_visits)
    gemm = [("bf16", s[0], *map(float, s[1:]), r) for s, r in bf16.items()]
    gemm += [("fp32", s[0], *map(float, s[1:]), r) for s, r in fp32.items()]
    bf16_best, fp32_best = max(bf16.values()), max(fp32.values())
    shared = measure_shared_cores(be, layer_bytes, 2 * len(be.host_cores))
    bus = measure_bus_GBps(64 * 2**20 if not quick else 8 * 2**20,
                           sorted(set(be.compute_cores) | set(be.host_cores)))
    attn = []
    for (seq, hd), vals in R["attn"].items():
        attn.append(("bf16", float(seq), float(hd), _mean_rate([v[0] for v in vals]),
                     _mean_rate([v[1] for v in vals])))
    elem = [(statistics.mean(x[i][0] for x in R["elem"]), R["elem"][0][i][1]) for i in (0, 1)]
    h2d, d2h = _mean_rate(R["h2d"]), _mean_rate(R["d2h"])
    dev = DeviceSpec(
        name=f"cpu-core ({be.compute_threads} thread{'s' if be.compute_threads > 1 else ''})",
        hbm_GiB=ram, bf16_TFLOPs=bf16_best, fp32_TFLOPs=fp32_best, hbm_GBps=slope_GBps(elem),
        default_link="cpu-threads", matmul_efficiency=statistics.median(bf16.values()) / bf16_best,
        reserved_GiB=0.0, launch_overhead_us=0.0, reduce_GBps=_mean_rate(R["reduce"]),
        loss_ns_per_logit=statistics.mean(R["loss"]),
        gemm_TFLOPs=tuple(gemm), attention_TFLOPs=tuple(attn))
    slowdown = statistics.mean(R["slowdown"])
    link = LinkSpec(name="cpu-threads", h2d_GBps=h2d, d2h_GBps=d2h, latency_us=0.0, pageable_GBps=h2d,
                    cpu_driven=True)
    hst = HostSpec(name=_cpu_name(), ram_GiB=ram, dram_GBps=max(bus, h2d, d2h), cores=os.cpu_count() or 1,
                   adam_Gparams_per_s=_mean_rate(R["adam"]),
                   os_reserved_GiB=min(max(1.0, _mem_in_use_GiB() + 0.5), ram / 2),
                   runtime_overhead_GiB=0.0, lane_cores=min(float(len(be.host_cores)), shared),
                   thread_GBps=_mean_rate(R["thread"]))
    hw = HardwareSpec(device=dev, link=link, host=hst)
    for t in tiny:
        t.close()
    comp_us, copy_us, host_us = op_overheads(hw, tiny[0].own)
    h1 = statistics.mean(tiny[0].own[head_id(TINY_POLICY)])
    h8 = statistics.mean(tiny[1].own[head_id(HEAD8_POLICY)])
    comp_us["head_chunk"] = max(0.0, (h8 - h1) / 7 * 1e6)

    hw = HardwareSpec(device=replace(dev, op_overhead_us=tuple(sorted(comp_us.items()))),
                      link=replace(link, latency_us=copy_us), host=replace(hst, op_latency_us=host_us))
    prog.step("lanes together: copies and CPU-lane ops next to a busy compute lane")
    busy = [busy_latencies(hw, "cpu", 2 if quick else 3) for _ in range(1 if quick else 2)]
    copy_busy = statistics.mean(b[0] for b in busy)
    host_busy = statistics.mean(b[1] for b in busy)
    reduces = [b[2] for b in busy if b[2] > 0]
    reduce = _mean_rate(reduces) if reduces else dev.reduce_GBps
    prog.done(f"a copy takes {copy_busy:.0f} us longer, a CPU-lane op {host_busy:.0f} us; an offload's norm "
              f"pass runs at {reduce:.1f} GB/s in place (alone: {dev.reduce_GBps:.1f}); a host lane copying "
              f"without pause slows compute by {slowdown - 1:+.1%} (not modelled)")
    prog.step("runtime RSS: a tiny model trained in a fresh process")
    res = probe(TINY, TINY_POLICY, steps=2, warmup=1)
    runtime = runtime_overhead_GiB(res)
    prog.done(", ".join(f"{k} {v:.0f} us" for k, v in comp_us.items())
              + f"; copies {copy_us:.0f} us, cpu-lane ops {host_us:.0f} us; runtime RSS {runtime * 1024:.0f} MiB; "
              f"host lanes share {shared:.2f} cores' worth, bus {bus:.1f} GB/s; bf16 GEMM best "
              f"{bf16_best * 1e3:.0f} GFLOP/s, median {statistics.median(bf16.values()) * 1e3:.0f}")

    prog.step("assemble the HardwareSpec")
    hw = HardwareSpec(
        device=replace(dev, op_overhead_us=tuple(sorted(comp_us.items())), reduce_GBps=reduce,
                       launch_overhead_us=comp_us.get(OpKind.FORWARD.value, 0.0)),
        link=replace(link, latency_us=copy_us, busy_latency_us=copy_busy),
        host=replace(hst, op_latency_us=host_us, runtime_overhead_GiB=runtime, busy_latency_us=host_busy),
        name=f"{hst.name}, CPU backend: compute on {be.compute_threads} core(s), lanes on "
             f"{len(be.host_cores)} ({'quick ' if quick else ''}calibrated {time.strftime('%Y-%m-%d %H:%M')})")
    prog.done(f"total {time.perf_counter() - t_start:.0f} s")
    return hw


def _calibrate_cuda(device, quick, model, policy, say, rounds) -> HardwareSpec:
    """The CUDA backend: copies are DMA over the real link (pinned and pageable), compute is
    the GPU, the optimizer runs on all host cores. Not exercised on the machine this was
    written on (no GPU); the CPU path is the one validated."""
    from horizon_exec.probe import probe
    if not torch.cuda.is_available():
        raise HorizonError(f"device {device!r}: torch sees no CUDA device here")
    dev_t = torch.device(device)
    sync = lambda: torch.cuda.synchronize(dev_t)  # noqa: E731
    prog = Progress(total=6, say=say)
    props = torch.cuda.get_device_properties(dev_t)
    t_start = time.perf_counter()

    prog.step(f"GEMM throughput on {props.name}")
    shapes = _gemm_shapes(quick, "cuda", model, policy)
    bf16 = measure_gemm_table(shapes, torch.bfloat16, dev_t, sync)
    fp32 = measure_gemm_table([(l, *s) for l in work.LAYOUTS for s in gemm_grid(True, "cuda")],
                              torch.float32, dev_t, sync, visits=1)
    gemm = [("bf16", s[0], *map(float, s[1:]), r) for s, r in bf16.items()]
    gemm += [("fp32", s[0], *map(float, s[1:]), r) for s, r in fp32.items()]

    prog.step("attention kernels and elementwise bandwidth")
    attn = []
    for seq, hd in attention_grid(quick, "cuda"):
        f, b = measure_attention(seq, hd, torch.bfloat16, dev_t, sync)
        attn.append(("bf16", float(seq), float(hd), f, b))
    elem = slope_GBps(measure_elementwise(torch.bfloat16, dev_t, quick, sync))
    loss_ns = measure_loss_ns_per_logit(32768, 4096, torch.bfloat16, dev_t, sync)

    prog.step("link: pinned and pageable h2d/d2h bandwidth, latency")
    n = 256 * 2**20 if not quick else 32 * 2**20
    d = torch.empty(n, dtype=torch.uint8, device=dev_t)
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    pageable = torch.empty(n, dtype=torch.uint8)
    h2d = n / _median_time(lambda: d.copy_(pinned, non_blocking=True), sync=sync) / 1e9
    d2h = n / _median_time(lambda: pinned.copy_(d, non_blocking=True), sync=sync) / 1e9
    pg = n / _median_time(lambda: d.copy_(pageable), sync=sync) / 1e9
    small_d, small_h = d[:4096], pinned[:4096]
    lat = _median_time(lambda: small_d.copy_(small_h, non_blocking=True), sync=sync) * 1e6

    prog.step("host: AdamW on all cores, DRAM bus")
    torch.set_num_threads(os.cpu_count() or 1)
    adam = measure_adam_Gparams(2**24 if not quick else 2**21, quick)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    bus = measure_bus_GBps(64 * 2**20, cores)
    ram = ram_GiB()

    from horizon_sim.specs.hardware_presets import DEVICES
    preset = next((p for p in DEVICES.values() if p.name.replace("-", " ") in props.name.lower()), None)
    bf16_best, fp32_best = max(bf16.values()), max(fp32.values())
    peak = max(preset.bf16_TFLOPs, bf16_best) if preset else bf16_best
    devspec = DeviceSpec(name=props.name, hbm_GiB=props.total_memory / GiB, bf16_TFLOPs=peak,
                         fp32_TFLOPs=max(preset.fp32_TFLOPs, fp32_best) if preset else fp32_best,
                         hbm_GBps=elem, default_link="calibrated", matmul_efficiency=min(1.0, bf16_best / peak),
                         reserved_GiB=(props.total_memory - torch.cuda.mem_get_info(dev_t)[0]) / GiB + 0.5,
                         launch_overhead_us=lat, loss_ns_per_logit=loss_ns,
                         gemm_TFLOPs=tuple(gemm), attention_TFLOPs=tuple(attn))
    link = LinkSpec(name="calibrated", h2d_GBps=h2d, d2h_GBps=d2h, latency_us=lat, pageable_GBps=pg)
    hst = HostSpec(name=_cpu_name(), ram_GiB=ram, dram_GBps=bus, cores=os.cpu_count() or 1,
                   adam_Gparams_per_s=adam, os_reserved_GiB=min(max(1.0, _mem_in_use_GiB() + 0.5), ram / 2))
    hw = HardwareSpec(device=devspec, link=link, host=hst)

    prog.step("fixed cost per op: a tiny model, ops serialized")
    comp_us, copy_us, host_us = op_overheads(hw, tiny_op_times(device, 4))
    res = probe(TINY, TINY_POLICY, steps=2, warmup=1, device=device)
    runtime = max(res["rss_peak_bytes"] - res["store_bytes"] - res["host_dynamic_peak_bytes"], 0) / GiB
    prog.step("assemble the HardwareSpec")
    hw = HardwareSpec(device=replace(devspec, op_overhead_us=tuple(sorted(comp_us.items()))),
                      link=replace(link, latency_us=max(lat, copy_us)),
                      host=replace(hst, op_latency_us=host_us, runtime_overhead_GiB=runtime),
                      name=f"{props.name} / {hst.name} (calibrated {time.strftime('%Y-%m-%d %H:%M')})")
    prog.done(f"total {time.perf_counter() - t_start:.0f} s")
    return hw
