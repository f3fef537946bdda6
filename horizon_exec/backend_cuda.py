"""CUDA backend: a stream per device lane, events for cross-lane dependencies, non_blocking
copies between the device and pinned host memory.

- The host store is ONE plain allocation registered with cudaHostRegister (page-locked in
  place): no caching-host-allocator power-of-two rounding on a terabyte store, and no
  thousands of pinned tensors. Dynamic host buffers (staging, checkpoints, per-step host
  grads) come from torch's pinned caching allocator, which reuses them step after step.
- Each lane thread makes its stream current (thread-local in PyTorch). A device lane that
  depends on another device lane's op waits on that op's end event on the GPU (no host sync);
  the CPU lane (optimizer, embedding) synchronizes on the event before touching host data.
- A device buffer freed by one lane may still be in use by queued work on another: release()
  records it on every lane stream, so the caching allocator will not reuse it too early.
- Timeline marks are CUDA events (seconds from an event recorded at step start); CPU-lane ops
  are host perf_counter times from the same instant, so cross-clock rows are approximate.
- Device memory peak: the caching allocator's max_memory_allocated over the step (the arena's
  own count, which charges declared sizes, is kept too).
Sync points: step_begin/step_end (every lane stream), lane_sync (a D2H lane that must add
into, or widen into, an fp32 host grad), and the CPU lane waiting for an event. Each is a
bounded poll (backend.wait_bounded), never a blocking driver call, so a hung kernel is
reported after the engine's timeout instead of hanging the process.
"""
import time

import torch

from horizon_exec.backend import DEVICE_LANES, Backend, wait_bounded
from horizon_exec.errors import ExecError


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device: str = "cuda"):
        if not torch.cuda.is_available():
            raise ExecError("device='cuda' but torch.cuda.is_available() is False")
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.streams = {lane: torch.cuda.Stream(self.device) for lane in DEVICE_LANES}
        self._registered: list[torch.Tensor] = []
        self._ev0 = None
        self._t0 = 0.0

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
        self._ev0 = torch.cuda.Event(enable_timing=True)
        self._ev0.record()
        wait_bounded(self._ev0, self.timeout_s, "the step's start event")
        self._t0 = time.perf_counter()

    def step_end(self):
        self._sync_all("the end of the step")

    def seconds(self, mark):
        if isinstance(mark, torch.cuda.Event):
            return self._ev0.elapsed_time(mark) / 1e3
        return mark - self._t0

    # ---- memory ---------------------------------------------------------------------------
    def empty(self, shape, dtype):
        return torch.empty(shape, dtype=dtype, device=self.device)

    def host_raw(self, nbytes):
        t = torch.empty(nbytes, dtype=torch.uint8)
        rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0)
        if int(rc) != 0:
            raise ExecError(f"cudaHostRegister of the {nbytes}-byte host store failed (error {int(rc)}); "
                            "is the memlock limit (ulimit -l) high enough?")
        self._registered.append(t)
        return t

    def host_empty(self, shape, dtype):
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def release(self, t):
        for s in self.streams.values():
            t.record_stream(s)

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
            stage = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
            stage.copy_(src, non_blocking=True)
            self.lane_sync()  # sync point: widen on the host once the bytes landed
            dst.copy_(stage)

    def d2h_add(self, dst, src):
        stage = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        stage.copy_(src, non_blocking=True)
        self.lane_sync()  # sync point: the bytes must land before the host adds them
        dst.add_(stage)

    def close(self):
        for t in self._registered:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        self._registered.clear()
