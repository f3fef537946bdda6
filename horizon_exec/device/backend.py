"""The small interface the engine and the op semantics need from a device, and a factory.

A backend owns: how a lane thread is set up (threads, core affinity, CUDA stream), how a lane
waits for another lane's op beyond the host-side "done" flag (CUDA: stream waits on events),
how time is measured (perf_counter or CUDA events), allocation (device tensors, the one host
store allocation, dynamic host buffers), the copies across the link, and how device memory is
measured. Lanes H2D, COMPUTE and D2H are device lanes; the CPU lane runs host work.
"""
import contextlib
import re
import time

from horizon_exec.errors import ExecError
from horizon_exec.device.host_pool import HostPool
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import Lane

DEVICE_LANES = (Lane.H2D, Lane.COMPUTE, Lane.D2H)


def wait_bounded(waitable, timeout_s: float, what: str, *, max_pause_s: float = 2e-4) -> None:
    """Wait until `waitable.query()` is true (a CUDA event or stream), polling with a short
    back-off instead of blocking inside the driver: a hung kernel or copy then becomes an
    ExecError naming `what` after `timeout_s`, not a process stuck for ever. The pause is
    capped at 0.2 ms, so a wait ends at most that late."""
    if waitable.query():
        return
    deadline = time.monotonic() + timeout_s
    pause = 1e-5
    while not waitable.query():
        if time.monotonic() > deadline:
            raise ExecError(f"{what} was not done after {timeout_s:g}s (a hung kernel or copy?)")
        time.sleep(pause)
        pause = min(2 * pause, max_pause_s)


class Backend:
    name = "base"
    device = None
    timeout_s: float = 600.0
    """Longest host-side wait for device work (make_backend(timeout_s=...); the trainer gives
    it the engine's bound)."""
    split_why: str = ""
    """CPU backend: how its compute threads were chosen (device/core_split.py), for logs."""

    # ---- lanes and ordering -------------------------------------------------------------
    def start_lane(self, lane: Lane) -> None:
        """Called once in each lane's worker thread before it runs ops."""

    def wait_device(self, lane: Lane, dep_marks) -> None:
        """After the host saw the deps done: order this lane's next work after their device
        work (end marks of ops on other lanes)."""

    def mark(self, lane: Lane):
        """A timestamp on this lane, taken in stream order (CUDA event) or now (host)."""
        raise NotImplementedError

    def lane_sync(self) -> None:
        """Block the host until the current lane's queued device work is done."""

    def step_begin(self) -> None: ...

    def step_end(self) -> None: ...

    def seconds(self, mark) -> float:
        """A mark as seconds since step_begin (valid after step_end)."""
        raise NotImplementedError

    # ---- memory ---------------------------------------------------------------------------
    def empty(self, shape, dtype):
        raise NotImplementedError

    def host_raw(self, nbytes: int):
        """One (nbytes,) uint8 host tensor for the host store."""
        raise NotImplementedError

    def register_host(self, t):
        """Host memory allocated elsewhere (the node's shared store) made usable by the link:
        page-locked on CUDA; returned as is."""
        return t

    pool: HostPool
    """Dynamic host buffers, exact-size blocks kept for reuse (host_pool.py); each backend
    makes its own (CUDA: page-locked blocks, reuse fenced by an event)."""

    def host_empty(self, shape, dtype):
        """A dynamic host buffer (host checkpoints, per-step host gradients), from the pool."""
        return self.pool.take(shape, dtype)

    def host_free(self, t) -> None:
        """A host_empty() buffer is being freed by the current lane: its block goes back to
        the pool for the next buffer of its size."""
        self.pool.give(t)

    def release(self, t) -> None:
        """A device buffer is being freed by the current lane."""

    def compute_scope(self, arena, what: str):
        """Context active while a compute op runs (CPU: measures its temporaries)."""
        return contextlib.nullcontext()

    def device_peak(self, arena) -> int:
        return arena.peak

    def reset_peak(self, arena) -> None:
        arena.reset_peak()

    # ---- the link -------------------------------------------------------------------------
    def h2d(self, dst, src) -> None:
        """dst (device) <- src (host), cast to dst's dtype on the device."""
        raise NotImplementedError

    def d2h(self, dst, src) -> None:
        """dst (host) <- src (device), cast to dst's dtype on the device before the link."""
        raise NotImplementedError

    def d2h_add(self, dst, src) -> None:
        """dst (host, fp32) += src (device), after the copy lands."""
        raise NotImplementedError

    def close(self) -> None: ...


def check_device(device) -> None:
    """HorizonError unless `device` is 'cpu', or 'cuda' / 'cuda:N' and torch has that GPU here."""
    m = re.fullmatch(r"cpu|cuda(?::(\d+))?", device) if isinstance(device, str) else None
    if not m:
        raise HorizonError(f"device {device!r} is not supported; use 'cpu' or 'cuda[:N]'")
    if device == "cpu":
        return
    import torch
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU here"
        raise HorizonError(f"device {device!r}: {why} (torch {torch.__version__}); use cpu")
    n = torch.cuda.device_count()
    if m.group(1) is not None and int(m.group(1)) >= n:
        raise HorizonError(f"device {device!r}: this machine has {n} CUDA device(s), cuda:0 .. cuda:{n - 1}")


def make_backend(device: str = "cpu", *, timeout_s: float = 600.0, **kw) -> Backend:
    """The backend for `device`; `kw` are the CPU backend's options (ignored on CUDA)."""
    check_device(device)
    if device == "cpu":
        from horizon_exec.device.cpu import CpuBackend
        b = CpuBackend(**kw)
    else:
        from horizon_exec.device.cuda import CudaBackend
        b = CudaBackend(device)
    b.timeout_s = timeout_s
    return b
