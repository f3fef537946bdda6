"""The compute lane's speed at each thread count the executor may give it (DeviceSpec.thread_speed):
the template block (forward and backward, temporaries tracked) on t intra-op threads pinned to
the first t cores, alone and with one host-lane thread copying without pause where the split
puts the lanes (their own cores when t < cores, else compute's). Relative to the base split's
alone time (the file's rates), so the planner can re-price the file for any t
(horizon_sim/specs/core_split.py). All configurations are timed in interleaved rounds and each
figure is the median of its per-round ratios, so the machine's drift cancels."""
import os
import statistics
import threading
import time

import torch

from horizon_exec.measure.calibrate.host import cold_pool
from horizon_exec.measure.calibrate.kernels import ELEMENTWISE_MODEL, block_pass


def thread_counts(cores: int) -> list[int]:
    """The counts measured (and so the ones 'auto' may choose): 1..cores on up to 8 cores, else
    powers of two and the top two (each costs a few block passes)."""
    if cores <= 8:
        return list(range(1, cores + 1))
    return sorted({*(1 << i for i in range(cores.bit_length()) if 1 << i <= cores), cores - 1, cores})


def _pin(cores) -> None:
    try:  # best effort, as CpuBackend.start_lane
        os.sched_setaffinity(0, cores)
    except (OSError, AttributeError):
        pass


def measure_thread_speeds(cores: list[int], base: int, quick: bool, dtype=torch.bfloat16) -> tuple:
    """Rows (THREADS, ALONE, SHARED) for thread_counts(len(cores)), relative to `base` threads
    alone, the template block computing in `dtype`."""
    from horizon_exec.device.arena import DeviceArena
    from horizon_exec.device.cpu import CpuBackend
    from horizon_exec.device.memtrack import TransientTracker
    counts = thread_counts(len(cores))
    pool = cold_pool(2**20, pool_bytes=48 * 2**20)
    dst = torch.empty_like(pool[0])
    lane_cores = {"v": cores}
    go, stop = threading.Event(), threading.Event()

    def copier():  # a host lane copying layer-sized buffers, wherever the split under test puts it
        torch.set_num_threads(1)
        i = 0
        while not stop.is_set():
            if not go.wait(0.01):
                continue
            _pin(lane_cores["v"])
            dst.copy_(pool[i % len(pool)])
            i += 1

    out: dict = {}

    def run():
        block = block_pass(ELEMENTWISE_MODEL, 1 if quick else 2, 128 if quick else 256, dtype, "cpu")
        arena = DeviceArena(CpuBackend(cores=cores))

        def timed(t, shared):
            torch.get_num_threads()  # ATen's lazy per-thread init first (CpuBackend.start_lane)
            torch.set_num_threads(t)
            _pin(cores[:t])
            lane_cores["v"] = cores[t:] or cores
            (go.set if shared else go.clear)()
            t0 = time.perf_counter()
            with TransientTracker(arena):
                block()
            dt = time.perf_counter() - t0
            go.clear()
            return dt

        for t in counts:
            timed(t, False)  # warm each count's thread team
        ratios = {(t, s): [] for t in counts for s in (False, True)}
        for r in range(2 if quick else 5):
            rnd = {k: timed(*k) for k in (list(ratios) if r % 2 == 0 else list(ratios)[::-1])}
            ref = rnd[(base, False)]
            for k, v in rnd.items():
                ratios[k].append(ref / v)
        out["rows"] = tuple((float(t), statistics.median(ratios[(t, False)]), statistics.median(ratios[(t, True)]))
                            for t in counts)

    th, cp = threading.Thread(target=run, name="calibrate-threads"), threading.Thread(target=copier)
    cp.start()
    try:
        th.start()
        th.join()
    finally:
        stop.set()
        cp.join()
    return out["rows"]
