"""How each kind of compute kernel speeds up with the compute lane's threads
(DeviceSpec.thread_kernel_speed): a GEMM, causal attention forward and backward, and elementwise
kernels, each timed alone at every thread count the executor may use (threads.thread_counts),
relative to the base split. The kinds scale differently: attention parallelises over batch and
heads and keeps every thread busy, while a GEMM's or an elementwise kernel's gain is capped by
what the threads share (a core's matrix unit when two vCPUs are one core's hyperthreads, the
memory bus). The whole template block (threads.py) mixes them in its own proportions; a model
with a long sequence spends more of its step in attention, and a split priced on the block alone
mispredicted it (horizon_sim/specs/core_split.py scales each kind's rates by its own row).

All counts are timed in interleaved rounds; each figure is the median of its per-round ratios,
so the machine's drift cancels."""
import os
import statistics
import time

import torch
import torch.nn.functional as F

from horizon_exec.measure.calibrate.threads import _pin

KINDS = ("gemm", "attention", "elementwise")


def kernels(quick: bool, dtype=torch.bfloat16) -> dict:
    """One callable per kind, in `dtype` (the one this machine trains in by default: the kinds
    scale differently in each, a bf16 GEMM without bf16 instructions hardly at all) at a training
    step's sizes: a block's up-projection GEMM (2,048 x 512 x 1,376; quick 512 rows), causal
    attention forward and backward (8 heads of 64 at 1,024 tokens; quick 512) and SwiGLU's
    elementwise product with its cast (2,048 x 1,376)."""
    rows, seq = (512, 512) if quick else (2048, 1024)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(rows, 512, generator=g).to(dtype)
    w = torch.randn(512, 1376, generator=g).to(dtype)
    q, k, v = (torch.randn(1, 8, seq, 64, generator=g).to(dtype).requires_grad_() for _ in range(3))
    x, y = torch.randn(rows, 1376, generator=g).to(dtype), torch.randn(rows, 1376, generator=g).to(dtype)

    def attention():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), o)

    return {"gemm": lambda: a @ w, "attention": attention, "elementwise": lambda: (F.silu(x.float()) * y).to(dtype)}


def measure_kernel_speeds(cores: list[int], base: int, quick: bool, counts: list[int], dtype=torch.bfloat16) -> tuple:
    """Rows (THREADS, GEMM, ATTENTION, ELEMENTWISE) for each of `counts`: each kind's speed in
    `dtype` at that many threads (pinned to the first cores) relative to `base` threads. Runs on
    the calling thread, whose thread count and affinity it restores."""
    fns = kernels(quick, dtype)
    prev_threads, prev_cores = torch.get_num_threads(), os.sched_getaffinity(0)

    def timed(t: int, kind: str) -> float:
        torch.set_num_threads(t)
        _pin(cores[:t])
        fns[kind]()  # the team at this count, and the kernel's first-call setup
        reps, t0 = 0, time.perf_counter()
        while reps < 3 or time.perf_counter() - t0 < (0.02 if quick else 0.05):
            fns[kind]()
            reps += 1
        return (time.perf_counter() - t0) / reps

    try:
        ratios = {(t, k): [] for t in counts for k in KINDS}
        for r in range(2 if quick else 5):
            rnd = {key: timed(*key) for key in (list(ratios) if r % 2 == 0 else list(ratios)[::-1])}
            for (t, k), s in rnd.items():
                ratios[(t, k)].append(rnd[(base, k)] / s)
    finally:
        torch.set_num_threads(prev_threads)
        _pin(prev_cores)
    return tuple((float(t), *(statistics.median(ratios[(t, k)]) for k in KINDS)) for t in counts)
