"""CUDA backend: a stream per device lane, events for cross-lane dependencies, non_blocking
copies between the device and pinned host memory.

- The host store is ONE plain allocation (on transparent huge pages, hugepages.py) registered
  with cudaHostRegister (page-locked in place): no caching-host-allocator power-of-two
  rounding on a terabyte store, and no thousands of pinned tensors. Dynamic host buffers
  (checkpoints, per-step host grads, widening stages) come from a HostPool of blocks
  registered the same way at their exact sizes and reused step after step (torch's pinned
  allocator would round each up to a power of two); a freed block is reused once an event on
  the freeing lane's stream has passed.
- Each lane thread makes its stream current (thread-local in PyTorch). A device lane that
  depends on another device lane's op waits on that op's end event on the GPU (no host sync);
  the CPU lane (optimizer, embedding) synchronizes on the event before touching host data.
- A device buffer freed by one lane may have been used by queued work on another. The op that
  frees it depends on every op that touched it (the builder makes each accessor a dependency
  of the freeing op) and its stream waited on their events (wait_device), so the freeing
  lane's stream is ordered after all that work: release() records the tensor on that stream
  only, and the caching allocator reuses the block once the stream passes the free. (Recording
  it on every lane stream also held it until unrelated queued work, e.g. weight prefetches
  waiting on later compute, had drained: a higher device peak than the schedule's.)
- Timeline marks are CUDA events (seconds from an event recorded at step start on the
  default stream of this device); CPU-lane ops are host perf_counter times from the host
  instant just before that event was recorded, so a CPU-lane op that waited for a device op
  never appears to start before it ended; a device op that waited for a CPU-lane op can read
  early by the time the start event took to record and reach the GPU (clock_window_s).
- Device memory peak: the caching allocator's max_memory_allocated over the step (the arena's
  own count, which charges declared sizes, is kept too).
Sync points: step_begin/step_end (every lane stream), lane_sync (a D2H lane that must add
into, or widen into, an fp32 host grad), and the CPU lane waiting for an event. Each is a
bounded poll (backend.wait_bounded), never a blocking driver call, so a hung kernel is
reported after the engine's timeout instead of hanging the process.
"""
import time

import torch

from horizon_exec.device.backend import DEVICE_LANES, Backend, wait_bounded
from horizon_sim.schedule.op import Lane
from horizon_exec.errors import ExecError
from horizon_exec.device.host_pool import HostPool
from horizon_exec.device.hugepages import host_bytes


_STREAMS: dict = {}
"""(device index, lane) -> its stream, for the life of the process. PyTorch keeps a cuBLAS
workspace (32 MiB on Hopper) for every (handle, stream) pair that ran a matmul and frees none of
them: fresh streams per backend leaked 64 MiB of device memory per Trainer (measured on an H200,
torch 2.11: a second Trainer in one process started with the first one's 66 MiB still
allocated). Reusing the streams bounds the workspaces to one set."""


def _lane_stream(device: torch.device, lane) -> torch.cuda.Stream:
    key = (device.index, lane)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device)
    return _STREAMS[key]


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device: str = "cuda"):
        if not torch.cuda.is_available():
            raise ExecError("device='cuda' but torch.cuda.is_available() is False")
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        # the fabric lane too: NCCL's collectives are ordered on it like the copies on theirs
        self.streams = {lane: _lane_stream(self.device, lane) for lane in (*DEVICE_LANES, Lane.FABRIC)}
        self._registered: list[torch.Tensor] = []
        # Dynamic host buffers and widening stages at their exact sizes (host_pool.py: torch's
        # pinned allocator would round each up to a power of two).
        self.pool = HostPool(lambda n: self.host_raw(n, "dynamic host buffer"), self._fence)
        self._ev0 = None
        self._t0 = 0.0
        self.clock_window_s = 0.0
        """The longest a step's zero took to record (step_begin): CPU-lane times read at most
        this much (plus the event's few microseconds to reach an idle GPU) late against
        device-lane times."""

    def start_lane(self, lane):
        torch.cuda.set_device(self.device)
        if lane in self.streams:
            torch.cuda.set_stream(self.streams[lane])

    def wait_device(self, lane, dep_marks):
        for mark in dep_marks:
            if isinstance(mark, torch.cuda.Event):
                if lane in self.streams:
                    torch.cuda.current_stream().wait_event(mark)  # GPU-side wait, host goes on
                else:                                             # host work needs the data
                    wait_bounded(mark, self.timeout_s, f"a CUDA event the {lane.value} lane waits on")

    def mark(self, lane):
        if lane in self.streams:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def lane_sync(self):
        wait_bounded(torch.cuda.current_stream(), self.timeout_s, "the D2H stream's queued copies")

    def _sync_all(self, what: str):
        """Every lane stream and the default stream, each a bounded wait."""
        for lane, s in self.streams.items():
            wait_bounded(s, self.timeout_s, f"{what}: the {lane.value} stream")
        wait_bounded(torch.cuda.default_stream(self.device), self.timeout_s, f"{what}: the default stream")

    def step_begin(self):
        self._sync_all("before the step")
        torch.cuda.reset_peak_memory_stats(self.device)
        # On THIS device's default stream: the calling thread's current device may be another
        # one (device='cuda:1'), and elapsed_time between events of two devices fails.
        stream = torch.cuda.default_stream(self.device)
        if self._ev0 is None:  # one event, re-recorded each step; created (lazily, by a first
            self._ev0 = torch.cuda.Event(enable_timing=True)  # record) outside the timed instant
            self._ev0.record(stream)
        # Host time zero is taken BEFORE the record, so it is never later than the instant the
        # GPU passes the event: a CPU-lane op that waited for a device op's end event then never
        # shows a start before that op's end (taking it after the bounded poll saw the event
        # done put CPU-lane times up to a poll pause early against the device's).
        self._t0 = time.perf_counter()
        self._ev0.record(stream)
        # The GPU passes the event no earlier than _t0 and, on an idle stream, a few
        # microseconds after the record returns; how long the record took (another Python
        # thread holding the interpreter lock can stretch it to milliseconds) bounds how late
        # CPU-lane times may read against device ones, for whoever checks cross-clock order.
        self.clock_window_s = max(self.clock_window_s, time.perf_counter() - self._t0)
        wait_bounded(self._ev0, self.timeout_s, "the step's start event")

    def step_end(self):
        self._sync_all("the end of the step")

    def seconds(self, mark):
        if isinstance(mark, torch.cuda.Event):
            return self._ev0.elapsed_time(mark) / 1e3
        return mark - self._t0

    # ---- memory ---------------------------------------------------------------------------
    def empty(self, shape, dtype):
        return torch.empty(shape, dtype=dtype, device=self.device)

    def host_raw(self, nbytes, what: str = "host store"):
        return self.register_host(host_bytes(nbytes), what)  # huge pages: 512x fewer pages to lock

    def register_host(self, t, what: str = "node's shared host store"):
        nbytes = t.numel()
        if not nbytes:
            return t
        # 1 = cudaHostRegisterPortable (what torch's own cuda/_pin_memory_utils.py passes):
        # pinned for every context, whichever device is current in the calling thread.
        with torch.cuda.device(self.device):
            rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 1)
        if int(rc) != 0:
            raise ExecError(f"cudaHostRegister of the {nbytes}-byte {what} failed (error {int(rc)}); "
                            "is the memlock limit (ulimit -l) high enough?")
        self._registered.append(t)
        return t

    def _fence(self):
        ev = torch.cuda.Event()
        ev.record()  # on the freeing lane's stream: after every queued use of the buffer
        return ev

    def release(self, t):
        # The freeing lane's stream is ordered after every use of t (module docstring).
        t.record_stream(torch.cuda.current_stream(self.device))

    def device_peak(self, arena):
        return int(torch.cuda.max_memory_allocated(self.device))

    def reset_peak(self, arena):
        arena.reset_peak()
        torch.cuda.reset_peak_memory_stats(self.device)

    # ---- the link -------------------------------------------------------------------------
    def h2d(self, dst, src):
        if src.dtype == dst.dtype:
            dst.copy_(src, non_blocking=True)
        else:  # e.g. fp32 master -> bf16 slot: move the fp32 bytes, cast on the device
            tmp = src.to(self.device, non_blocking=True)
            dst.copy_(tmp)

    def d2h(self, dst, src):
        if src.dtype == dst.dtype:
            dst.copy_(src, non_blocking=True)
        elif dst.element_size() < src.element_size():
            dst.copy_(src.to(dst.dtype), non_blocking=True)  # narrow on the device, then the link
        else:  # e.g. bf16 grads into an fp32 host accumulator: the link carries bf16
            self._through_stage(src, dst.copy_)  # widen on the host once the bytes landed

    def d2h_add(self, dst, src):
        self._through_stage(src, dst.add_)  # the bytes must land before the host adds them

    def _through_stage(self, src, host_op):
        """src (device) -> a pooled pinned stage -> host_op(stage), after a sync point."""
        stage = self.pool.take(src.shape, src.dtype)
        try:
            stage.copy_(src, non_blocking=True)
            self.lane_sync()
            host_op(stage)
        finally:
            self.pool.give(stage)  # the copy has landed (or failed): reusable at once

    def close(self):
        if not self._registered:
            return
        # Queued copies may still read or write the store (a step that was interrupted, or a
        # lane left running by a broken engine): unregistering under a DMA is undefined. Wait
        # (bounded) for the streams; if they do not drain, leave the memory registered (the
        # process's exit releases it) rather than unpin it under the copy engine.
        try:  # at most a minute in all (close may run in a finalizer), not timeout_s per stream
            deadline = time.monotonic() + 60.0
            for s in (*self.streams.values(), torch.cuda.default_stream(self.device)):
                wait_bounded(s, max(0.0, deadline - time.monotonic()), "closing the CUDA backend")
        except Exception:
            return
        with torch.cuda.device(self.device):
            for t in self._registered:
                torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        self._registered.clear()
