"""Lanes together: what copies and CPU-lane ops cost extra next to a busy compute lane (a small
model trained normally), and how much a host lane copying without pause slows the compute core."""
import statistics
import threading
import time

import torch

from horizon_exec.measure.calibrate.host import cold_pool
from horizon_exec.measure.calibrate.kernels import ELEMENTWISE_MODEL, block_pass
from horizon_exec.measure.calibrate.timing import in_lane
from horizon_sim.schedule import Lane, OpKind, build_schedule
from horizon_sim.sim.costs import CostModel
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


CONTENTION_MODEL = ModelSpec(name="calibrate-contention", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2,
                             ffn_hidden=688, vocab=256)
CONTENTION_POLICY = Policy(batch=2, seq=128)


def alone_next_to_compute(tl):
    """Rows of host-lane ops (h2d, d2h, cpu) in a measured timeline that started while a compute
    op ran and that no op of another host lane overlapped. The simulator shares the host-lane
    cores between lanes itself: an op that overlapped another host lane's op (the pipelined
    optimizer next to a weight load) ran slower for that, and would count the sharing twice."""
    comp = tl[tl.lane == Lane.COMPUTE.value]
    host = tl[tl.lane != Lane.COMPUTE.value]
    for r in host.itertuples():
        if not ((comp.start_s <= r.start_s) & (comp.end_s > r.start_s)).any():
            continue
        if ((host.lane != r.lane) & (host.start_s < r.end_s) & (host.end_s > r.start_s)).any():
            continue
        yield r


def busy_latencies(hw: HardwareSpec, device: str, steps: int) -> tuple[float, float, float]:
    """How much longer copies and CPU-lane ops take when they run next to the compute lane:
    a small model trained normally (lanes overlapping), and for each plain copy or CPU-lane op
    that started while a compute op ran and that no op of another host lane overlapped, its
    measured time less what `hw` predicts for it alone. Returns (mean extra µs of a copy, of a
    CPU-lane op, and the offloads' squared-norm pass in GB/s: what such an offload takes beyond
    its copy and that extra; 0.0 where no op qualified). On the CPU backend the
    extra is the thread waiting for the interpreter lock and the arena's lock, which the compute
    lane's kernel dispatch and memory tracking keep taking, and sharing the cache; the norm
    pass's fp32 temporary is served as the executor's allocator state serves it."""
    from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    sched = build_schedule(CONTENTION_MODEL, CONTENTION_POLICY)
    costs = CostModel(hw, CONTENTION_POLICY.compute_dtype, sched.meta)
    gen = torch.Generator().manual_seed(0)
    extra: dict = {"copy": [], "cpu": []}
    offloads = []  # (link bytes, measured s, copy part alone s)
    rt = RuntimeConfig(device=device, compute_threads=None)  # cores - 1: the split the file's rates are for
    with Trainer(CONTENTION_MODEL, CONTENTION_POLICY, TrainerConfig(runtime=rt)) as tr:
        for i in range(steps + 1):
            tl = tr.step(torch.randint(0, CONTENTION_MODEL.vocab, (CONTENTION_POLICY.batch, CONTENTION_POLICY.seq),
                                       generator=gen)).timeline
            if not i:
                continue
            for r in alone_next_to_compute(tl):
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
    lane while a host-lane thread copies without pause, over its time alone. Alone and loaded
    passes alternate and the result is the median of their pairwise ratios, so a drift of the
    machine's speed during the measurement cancels instead of landing on one side."""
    from horizon_exec.device.arena import DeviceArena
    from horizon_exec.device.memtrack import TransientTracker
    arena = DeviceArena(backend)
    # quick (for tests): a quarter of the tokens (bf16 GEMMs crawl on CPUs without AVX-512);
    # a block pass still outlasts many copies
    block = block_pass(ELEMENTWISE_MODEL, 1 if quick else 2, 128 if quick else 256, torch.bfloat16, "cpu")
    pool = cold_pool(2**20, pool_bytes=48 * 2**20)
    dst = torch.empty_like(pool[0])
    go, stop = threading.Event(), threading.Event()

    def timed():
        t0 = time.perf_counter()
        with TransientTracker(arena):
            block()
        return time.perf_counter() - t0

    def copier():
        backend.start_lane(Lane.H2D)
        i = 0
        while not stop.is_set():
            if not go.wait(0.01):
                continue
            dst.copy_(pool[i % len(pool)])
            i += 1

    def pairs(n):
        timed()  # warm
        ratios = []
        for _ in range(n):
            go.clear()
            alone = timed()
            go.set()
            loaded = timed()
            ratios.append(loaded / alone)
        go.clear()
        return statistics.median(ratios)

    t = threading.Thread(target=copier)
    t.start()
    try:
        return in_lane(backend, Lane.COMPUTE, lambda: pairs(3 if quick else 8))
    finally:
        stop.set()
        t.join()
