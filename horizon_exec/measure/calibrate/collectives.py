"""Collectives between processes on this machine, as a data-parallel CPU run would use them: two
processes join a torch.distributed gloo group over loopback TCP and time all_reduce of a small
and a large tensor. A ring all-reduce over N ranks takes 2 (N - 1) steps of latency plus
2 (N - 1) / N of the bytes per rank, so with two ranks T(S) = 2 latency + S / bandwidth; the
two sizes give both. The planner's collectives (a reduce-scatter or all-gather: N - 1 steps and
(N - 1) / N of the bytes) are costed with the same two figures (ClusterSpec fabric_* and net_*:
on one machine, "devices" and "nodes" talk over the same loopback).
"""
import multiprocessing
import os
import socket
import statistics
import time

SMALL_BYTES = 4 * 1024
LARGE_BYTES = 16 * 2**20
QUICK_LARGE_BYTES = 2 * 2**20
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, sizes: tuple[int, ...], repeats: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        times = {}
        for n in sizes:
            t = torch.ones(n // 4, dtype=torch.float32)
            for _ in range(3):  # warm-up: connections, buffers
                dist.all_reduce(t)
            samples = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                samples.append(time.perf_counter() - t0)
            times[n] = statistics.median(samples)
        if rank == 0:
            out.put(times)
    finally:
        dist.destroy_process_group()


def measure_loopback(quick: bool = False, timeout_s: float = 120.0) -> tuple[float, float]:
    """(GB/s, latency in microseconds) of a gloo ring step between two processes here."""
    large = QUICK_LARGE_BYTES if quick else LARGE_BYTES
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no lane threads inherited
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, (SMALL_BYTES, large), 5 if quick else 15, out), daemon=True)
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
    per_byte = max(t_large - t_small, 1e-9) / (large - SMALL_BYTES)
    latency_s = max(0.0, (t_small - SMALL_BYTES * per_byte) / 2)
    return 1e-9 / per_byte, latency_s * 1e6
