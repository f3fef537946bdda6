"""Timing for the calibration: medians of repeated calls, a thread set up like an executor lane,
numbered progress lines, a dispatch mode timing each aten kernel, and the mean of rates over
rounds taken on time."""
import statistics
import threading
import time
from dataclasses import dataclass

import torch

from horizon_sim.schedule import Lane


def median_time(fn, *, min_s: float = 0.02, max_reps: int = 50, min_reps: int = 3, sync=None) -> float:
    """Median seconds of fn() over enough repeats to fill ~min_s (after one warm-up call)."""
    fn()
    if sync:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    est = max(time.perf_counter() - t0, 1e-7)
    reps = int(min(max_reps, max(min_reps, min_s / est)))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def in_lane(backend, lane: Lane, fn):
    """Run fn() in a fresh thread set up like the executor's `lane` worker; return its result."""
    out = {}

    def body():
        try:
            backend.start_lane(lane)
            out["v"] = fn()
        except BaseException as e:  # re-raised in the caller
            out["e"] = e

    t = threading.Thread(target=body, name=f"calibrate-{lane.value}")
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]
    return out["v"]


@dataclass
class Progress:
    """Numbered progress lines on `say` (print by default), with the time each part took."""
    total: int
    say: object = print
    n: int = 0
    t0: float = 0.0

    def step(self, what: str) -> None:
        self.done()
        self.n += 1
        self.t0 = time.perf_counter()
        if self.say:
            self.say(f"calibrate [{self.n}/{self.total}] {what} ...")

    def done(self, note: str = "") -> None:
        if self.t0 and self.say:
            self.say(f"    {time.perf_counter() - self.t0:.1f} s{'; ' + note if note else ''}")
        self.t0 = 0.0


class KernelTimer:
    """A dispatch mode that times each aten kernel and sorts it into GEMM, attention forward,
    attention backward, view (no data movement) or elementwise; elementwise bytes are what
    each kernel's tensor arguments and outputs hold (read plus write). A Python attention's own
    elementwise kernels (softcap_attention.py) count as its time, their bytes apart by phase
    (attention_bytes: what schedule/work.py softcap_elementwise_bytes prices)."""

    GEMM = ("aten.mm", "aten.addmm", "aten.bmm")

    def __new__(cls, sync=None):
        from torch.utils._pytree import tree_leaves

        from horizon_exec.device.dispatch_mode import UncompiledDispatchMode
        from horizon_exec.model.softcap_attention import phase as attention_phase

        class _Mode(UncompiledDispatchMode):
            def __init__(self):
                super().__init__()
                self.time = {"gemm": 0.0, "attention_fwd": 0.0, "attention_bwd": 0.0, "elementwise": 0.0}
                self.bytes = 0
                self.attention_bytes = {"attention_fwd": 0, "attention_bwd": 0}
                self.kernels = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                sch = func._schema
                write = any(a.alias_info is not None and a.alias_info.is_write for a in sch.arguments)
                view = (not write and sch.returns and all(r.alias_info is not None for r in sch.returns)) \
                    or name.startswith("aten._unsafe_view")
                t0 = time.perf_counter()
                out = func(*args, **(kwargs or {}))
                if sync:
                    sync()
                dt = time.perf_counter() - t0
                if view:
                    return out
                self.kernels += 1
                gemm = name.startswith(KernelTimer.GEMM)
                moved = 0 if gemm else sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                                           if isinstance(t, torch.Tensor))
                if attention_phase():  # a Python attention's own kernels (softcap_attention.py)
                    self.time[attention_phase()] += dt
                    self.attention_bytes[attention_phase()] += moved
                elif gemm:
                    self.time["gemm"] += dt
                elif "attention" in name:
                    self.time["attention_bwd" if "backward" in name else "attention_fwd"] += dt
                else:
                    self.time["elementwise"] += dt
                    self.bytes += moved
                return out

        return _Mode()


def mean_rate(rates) -> float:
    """Mean over rounds taken on times (the harmonic mean of rates): the machine's average."""
    return len(rates) / sum(1.0 / r for r in rates)
