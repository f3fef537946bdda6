"""CPU backend: the "device" is host memory and the compute lane's own core(s).

One worker thread per lane; an op runs to completion in its lane thread, so the host-side done
flag is the whole dependency. The compute lane gets `compute_threads` intra-op threads pinned
to its own cores (default: all cores but one); the copy and optimizer lanes share the rest.
Given every core (the planner's split for a step whose lanes mostly idle: device/core_split.py),
compute shares them with the lanes, each lane one intra-op thread on all cores (the OS
time-shares them; the planner prices what that costs compute: specs/core_split.py).
Its bf16 GEMMs, on a CPU without bf16 matrix instructions, go through fp32 (bf16_gemm.py).
Device slots and activations are ordinary tensors, but every one is charged to the arena, and
each compute op's temporaries are measured by a dispatch-mode tracker (memtrack.py).
Dynamic host buffers (host checkpoints, per-step host grads) come from a HostPool, as on CUDA:
kept at their exact size and reused, so the memory held is what the planner counts (per size,
the most live at once on its simulated timeline; more where a lane lags further, e.g. the
optimizer in `backward` mode) and a step does not fault fresh pages in (~0.4 ms per 6 MB buffer).
A buffer is freed by an op that ran after every op that touched it, to completion in its lane
thread, so its block is reusable at once (no fence).
The host store and the pool's blocks sit on transparent huge pages (hugepages.py).
The thread that builds the backend runs its own torch work on one intra-op thread until
close(), so that the compute lane's OpenMP team is the process's only one with more than one
thread (libgomp slows every team once their threads outnumber the cores: __init__).
"""
import os
import threading
import time

import torch

from horizon_exec.device import bf16_gemm
from horizon_exec.device.backend import Backend
from horizon_exec.device.hugepages import host_bytes
from horizon_exec.device.host_pool import HostPool
from horizon_exec.device.memtrack import TransientTracker
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import Lane


def cpu_cores() -> list[int]:
    """The cores this process may run on."""
    return _cores()


def drive_on_one_thread() -> int:
    """The calling thread's torch intra-op threads set to one; returns the count it had. The
    thread that drives a CPU run calls it before its own torch work, so that the compute lane's
    OpenMP team is the process's only one (CpuBackend.__init__ says why)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    return before


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, compute_threads: int | None = None, pin_cores: bool = True,
                 cores: list[int] | None = None, compute_dtype: str = "fp32"):
        if compute_threads is not None and (not isinstance(compute_threads, int) or compute_threads < 1):
            raise HorizonError(f"compute_threads={compute_threads!r} must be a positive integer (None: cores - 1)")
        self.device = torch.device("cpu")
        cores = list(cores) if cores else _cores()  # data parallel: this rank's share (dist/context.cores_of)
        if compute_threads is not None and compute_threads > len(cores):
            raise HorizonError(f"compute_threads={compute_threads} but this process runs on {len(cores)} "
                               f"core(s) {cores}: at most {len(cores)}")
        self.compute_threads = compute_threads or max(1, len(cores) - 1)
        self.compute_cores = cores[:self.compute_threads]
        self.host_cores = cores[self.compute_threads:] or cores
        # Lanes on compute's cores take one thread each: more would each wait at the barriers
        # of an intra-op team whose threads compute's keep preempting.
        self.lane_threads = len(cores) - self.compute_threads or 1
        self.pin_cores = pin_cores and hasattr(os, "sched_setaffinity")
        self.pool = HostPool(host_bytes)
        self._t0 = 0.0
        # The thread that builds the backend drives the trainer and does its host work between
        # steps (init, loads, saves); from here until close() it runs its own torch ops on one
        # intra-op thread. libgomp counts the threads of every OpenMP team in the process, and
        # once they outnumber the cores it cuts each team's spin-wait to ~100 iterations, so
        # the compute lane's workers sleep between parallel regions and each short kernel waits
        # for them to wake. A team on this thread (from any parallel op it ran with more than
        # one thread) took the tiny model's compute from 1.6x faster on two threads to ~1.1x.
        # A team this thread made before the backend stays (libgomp keeps it until the thread
        # ends): a process that drives the trainer should not run multi-threaded torch before.
        self._driver = threading.get_ident(), drive_on_one_thread()
        # A bf16 run on a CPU without bf16 matrix instructions: its GEMMs through fp32, as fast as
        # fp32's and rounded as a bf16 kernel rounds (bf16_gemm.py), until close().
        self.bf16_gemms_through_fp32 = bf16_gemm.needed(compute_dtype)
        if self.bf16_gemms_through_fp32:
            bf16_gemm.acquire()

    def close(self) -> None:
        """The driving thread's intra-op threads as they were (only from that thread: the count
        is per thread); PyTorch's bf16 GEMMs again once no other backend needs fp32's."""
        if self.bf16_gemms_through_fp32:
            self.bf16_gemms_through_fp32 = False
            bf16_gemm.release()
        ident, threads = self._driver
        if threading.get_ident() == ident:
            torch.set_num_threads(threads)

    def start_lane(self, lane: Lane) -> None:
        compute = lane == Lane.COMPUTE
        # ATen sets a thread's OpenMP thread count once more on its first parallel op, to the
        # count the process last set from ANY thread (at::internal::lazy_init_num_threads): the
        # compute lane then ran with the lanes' count whenever they started after it. Have that
        # happen first, then set this lane's own.
        torch.get_num_threads()
        torch.set_num_threads(self.compute_threads if compute else self.lane_threads)
        if self.pin_cores:
            try:  # this thread only; best effort (a container may forbid it)
                os.sched_setaffinity(0, self.compute_cores if compute else self.host_cores)
            except OSError:
                pass

    def mark(self, lane):
        return time.perf_counter()

    def step_begin(self):
        self._t0 = time.perf_counter()

    def seconds(self, mark) -> float:
        return mark - self._t0

    def empty(self, shape, dtype):
        return torch.empty(shape, dtype=dtype)

    def host_raw(self, nbytes):
        return host_bytes(nbytes)

    def compute_scope(self, arena, what):
        return TransientTracker(arena, what)

    def h2d(self, dst, src):
        dst.copy_(src)

    def d2h(self, dst, src):
        dst.copy_(src)

    def d2h_add(self, dst, src):
        dst.add_(src)
