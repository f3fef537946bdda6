"""Collectives between processes on this machine, as a data-parallel CPU run uses them: two
processes join a torch.distributed gloo group over loopback TCP and time the executor's own
per-unit collective, its reduce-scatter of bf16 gradients (horizon_exec.dist.collectives.
reduce_scatter), at a small and a large size. The planner costs a reduce-scatter over N ranks
as N - 1 steps of latency plus (N - 1) / N of the bytes at the fabric's rate, so with two ranks
T(S) = latency + S / (2 bandwidth); the two sizes give both, in the planner's own terms (gloo's
collective is not a bandwidth-optimal ring, and the fit absorbs that rather than assuming it).
ClusterSpec fabric_* and net_* take the same two figures: on one machine, "devices" and "nodes"
talk over the same loopback.
"""
import multiprocessing
import os
import statistics
import time

from horizon_exec.dist.context import free_port

SMALL_BYTES = 4 * 1024
LARGE_BYTES = 4 * 2**20
"""The size of a unit's gradient in the models a CPU backend trains (1-4 MB in validate's): gloo's
time per byte is not constant (measured here, bf16: 1.4 ns/B from 4 KB to 2 MB, 0.9 ns/B from
2 to 16 MB), so the fit spans the sizes the executor sends."""
WORLD = 2


def _rank(rank: int, port: int, sizes: tuple[int, ...], repeats: int, out) -> None:
    import torch
    import torch.distributed as dist

    from horizon_exec.dist.collectives import reduce_scatter
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    group = dist.group.WORLD
    try:
        bufs = {}
        for n in sizes:
            full = torch.ones(n // 2, dtype=torch.bfloat16)  # n bytes of gradient, as the executor's
            bufs[n] = (torch.empty(full.numel() // WORLD, dtype=full.dtype), full)
            for _ in range(3):  # warm-up: connections, buffers
                reduce_scatter(*bufs[n], group)
        samples = {n: [] for n in sizes}
        for _ in range(repeats):  # the sizes alternate, so a slow spell lands on both
            for n, (mine, full) in bufs.items():
                full.fill_(1.0)
                dist.barrier()
                t0 = time.perf_counter()
                reduce_scatter(mine, full, group)
                samples[n].append(time.perf_counter() - t0)
        # the mean, not the median: a step pays every collective's wake-up jitter (here 0.2 to 6 ms
        # for 4 KB, bimodal), and the sum of a step's collectives goes as their mean; the slowest
        # and fastest tenth are dropped (a descheduled rank)
        times = {n: statistics.mean(sorted(v)[len(v) // 10:len(v) - len(v) // 10]) for n, v in samples.items()}
        if rank == 0:
            out.put(times)
    finally:
        dist.destroy_process_group()


def measure_loopback(quick: bool = False, timeout_s: float = 120.0) -> tuple[float, float]:
    """(GB/s, latency in microseconds) of a ring step between two processes here, fitted to the
    executor's reduce-scatter (module docstring)."""
    large = LARGE_BYTES
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no lane threads inherited
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, (SMALL_BYTES, large), 11 if quick else 31, out), daemon=True)
             for r in range(WORLD)]
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        for p in procs:
            p.start()
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    try:
        times = out.get(timeout=timeout_s)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    t_small, t_large = times[SMALL_BYTES], times[large]
    per_byte = max(t_large - t_small, 1e-9) / (large - SMALL_BYTES)  # = (N - 1) / N / bandwidth
    latency_s = max(0.0, (t_small - SMALL_BYTES * per_byte) / (WORLD - 1))
    return 1e-9 * (WORLD - 1) / WORLD / per_byte, latency_s * 1e6
