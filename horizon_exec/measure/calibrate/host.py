"""The host side: one thread's copy, squared-norm and gradient-accumulation rates, the AdamW op's
rate, how many cores' worth the host-lane threads share, the DRAM bus, and the machine's RAM,
memory in use and CPU name."""
import os
import statistics
import threading
import time

import torch

from horizon_exec.procfs import meminfo_bytes
from horizon_exec.device.hugepages import host_bytes

from horizon_exec.measure.calibrate.timing import median_time
from horizon_exec.runtime.sq_norm import sq_norm
from horizon_sim.schedule import Lane
from horizon_sim.sim.costs import COPY_TRAFFIC
from horizon_sim.units import GiB


def _host(numel: int, dtype=torch.float32, fill: float = 0.0):
    """A host buffer in the memory the executor's host store and pool use (hugepages.py), so
    the rates measured here are the ones the executor's host-side buffers see."""
    return host_bytes(numel * dtype.itemsize).view(dtype).fill_(fill)


def cold_pool(nbytes: int, dtype=torch.bfloat16, pool_bytes: int = 96 * 2**20, host: bool = True):
    """Buffers of nbytes whose total exceeds the last-level cache, used round robin so each
    use finds its buffer cold. host: in the executor's host memory (the store, the pool), else
    plain tensors (the CPU backend's device buffers)."""
    n = max(2, pool_bytes // max(nbytes, 1))
    numel = nbytes // dtype.itemsize
    return [_host(numel, dtype, 1.0) if host else torch.ones(numel, dtype=dtype) for _ in range(n)]


def measure_copy_GBps(nbytes: int, direction: str) -> float:
    """One thread's copy rate for an nbytes buffer: h2d reads a cold source into a warm
    destination (load_weights: host store -> slot), d2h a warm source into a cold one (the
    cold side in host memory, the warm side a device buffer)."""
    pool = cold_pool(nbytes)
    warm = torch.empty_like(pool[0])
    it = iter(range(10**9))

    def one():
        b = pool[next(it) % len(pool)]
        if direction == "h2d":
            warm.copy_(b)
        else:
            b.copy_(warm)
    return nbytes / median_time(one, min_s=0.03) / 1e9


def measure_reduce_GBps(nbytes: int) -> float:
    """An offload's squared-norm pass (runtime/sq_norm.py: through a float32 scratch) over a
    bf16 gradient, as the copy lane does it: gradients cold in this core's cache."""
    pool = cold_pool(nbytes, pool_bytes=48 * 2**20, host=False)  # device-side gradients
    it = iter(range(10**9))

    def one():
        sq_norm(pool[next(it) % len(pool)])
    for _ in range(3):
        one()
    return nbytes / median_time(one, min_s=0.03) / 1e9


def measure_accumulate_GBps(n_params: int) -> float:
    """One host thread accumulating a bf16 gradient into a cold fp32 host gradient (what an
    offload does with micro-batches), in the bytes the schedule counts for it: 8 per
    parameter (read and write the fp32 sum)."""
    dsts = [_host(n_params) for _ in range(max(2, (64 * 2**20) // (4 * n_params)))]
    src = torch.ones(n_params, dtype=torch.bfloat16)
    it = iter(range(10**9))
    return 8 * n_params / median_time(lambda: dsts[next(it) % len(dsts)].add_(src), min_s=0.03) / 1e9


def measure_adam_Gparams(n_params: int, quick: bool) -> float:
    """Parameters/s of the executor's AdamW op (bf16 grads, fp32 master and moments, bf16
    working copy refreshed), with the kernel the executor will use here. As in a step, the
    unit's master, moments and working copy are cold (several units round robin) and its
    gradient is warm (the copy lane has just written it)."""
    from horizon_exec.optim.adamw import AdamW
    opt = AdamW()
    units = []
    for _ in range(2 if quick else 4):
        units.append((_host(n_params), _host(n_params), _host(n_params), torch.zeros(()),
                      _host(n_params, torch.bfloat16)))
    grad = _host(n_params, torch.bfloat16, 1e-3)
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


ADAM_TRAFFIC_BYTES = 28
"""DRAM bytes the planner counts per parameter of measure_adam_Gparams' update (the Schedule's
optimizer op, schedule/builder.py: fp32 master and both fp32 moments read and written, the bf16
gradient read, the bf16 working copy written)."""


def bus_capacity_GBps(bus_GBps: float, adam_Gparams: float, *flow_GBps: float) -> float:
    """The DRAM bus as the planner shares it (HostSpec.dram_GBps): at least the traffic any one
    flow was measured moving alone. The all-core copy loop reads below what AdamW moves on an
    H200 box's host (98.9 GB/s vs 5.42 G params/s x 28 B = 152 GB/s): a bus capped at the copy
    figure slowed the planned update to 0.557 s where it ran in 0.390 s (docs/gpu_runs.md)."""
    return max(bus_GBps, ADAM_TRAFFIC_BYTES * adam_Gparams, *flow_GBps)


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
    """All cores copying large buffers at once: the DRAM bus, in bytes of traffic per second
    (HostSpec.dram_GBps's unit: each byte copied is read and written, COPY_TRAFFIC)."""
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
    return COPY_TRAFFIC * sum(reps * nbytes / done[i] for i in done) / 1e9


def ram_GiB() -> float:
    total = meminfo_bytes("MemTotal")
    return (total or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / GiB


def os_reserved_GiB(ram: float) -> float:
    """RAM the OS and everything else running keep (MemTotal - MemAvailable now, + 0.5 GiB),
    at least 1 GiB and at most half the RAM; 1 GiB where /proc/meminfo is missing."""
    total, avail = meminfo_bytes("MemTotal"), meminfo_bytes("MemAvailable")
    in_use = (total - avail) / GiB if total is not None and avail is not None else 1.0
    return min(max(1.0, in_use + 0.5), ram / 2)


