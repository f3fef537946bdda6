"""Device arena: every device allocation of the executor goes through here, against a byte
budget, so "device memory" is a measured number on every backend.

Named buffers (weight slots, RoPE tables, the schedule's activations and gradients) are
charged their declared bytes while they live. Op temporaries (intermediates, autograd's saved
tensors) are charged through `transient()` by a tracker on the compute lane. The peak is
max(buffers + temporaries) over the step. Thread-safe: every lane allocates and frees.
"""
import threading
import time

from horizon_exec.errors import DeviceBudgetError
from horizon_sim.units import fmt_bytes


class DeviceArena:
    def __init__(self, backend, budget_bytes: int | None = None):
        self.backend = backend
        self.budget = budget_bytes
        self._lock = threading.RLock()
        self.tensors: dict[str, object] = {}
        self._bytes: dict[str, int] = {}
        self.ptrs: set[int] = set()  # storage addresses of named buffers (not temporaries)
        self.live = 0
        self.temp = 0
        self.peak = 0
        self._watch: list | None = None  # (time, live) per change while a replayed op runs

    # ---- accounting -----------------------------------------------------------------------
    def _charge(self, n: int, what: str) -> None:  # caller holds the lock
        if self.budget is not None and self.live + self.temp + n > self.budget:
            raise DeviceBudgetError(
                f"device memory budget {fmt_bytes(self.budget)} exceeded: {what} needs {fmt_bytes(n)} "
                f"with {fmt_bytes(self.live)} in buffers and {fmt_bytes(self.temp)} in op temporaries "
                "live; raise the budget or lower batch, seq, slots or act_ckpt_every")

    def _update_peak(self) -> None:
        self.peak = max(self.peak, self.live + self.temp)

    def transient(self, delta: int, what: str = "an op temporary") -> None:
        """Charge (delta > 0) or release (delta < 0) op temporaries."""
        with self._lock:
            if delta > 0:
                self._charge(delta, what)
            self.temp += delta
            self._update_peak()

    def watch(self) -> tuple[float, int]:
        """Start logging the named buffers' bytes as they change (while an op whose temporaries
        are replayed runs); returns (now, bytes live now)."""
        with self._lock:
            self._watch = []
            return time.perf_counter(), self.live

    def replayed(self, what: str, peak_of) -> None:
        """Stop logging; `peak_of(t1, changes)` gives the most the replayed op's run held
        (TempProfile.replay_peak): it counts toward the peak and must fit the budget."""
        with self._lock:
            changes = self.unwatch()
            total = peak_of(time.perf_counter(), changes)
            if self.budget is not None and total > self.budget:
                raise DeviceBudgetError(
                    f"device memory budget {fmt_bytes(self.budget)} exceeded: {what} brought the device "
                    f"to {fmt_bytes(total)} (its temporaries as first measured, with the buffers live "
                    "meanwhile); raise the budget or lower batch, seq, slots or act_ckpt_every")
            self.peak = max(self.peak, total)

    def unwatch(self) -> list:
        """Stop logging; the (time, live) changes logged since watch()."""
        with self._lock:
            changes, self._watch = self._watch or [], None
            return changes

    def _logged(self) -> None:  # caller holds the lock
        if self._watch is not None:
            self._watch.append((time.perf_counter(), self.live))

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.live + self.temp

    # ---- named buffers --------------------------------------------------------------------
    def alloc(self, name: str, shape, dtype, nbytes: int):
        """A new device tensor for buffer `name`, charged `nbytes` (its declared size)."""
        with self._lock:
            if name in self.tensors:
                raise RuntimeError(f"device buffer {name!r} is already allocated")
            self._charge(nbytes, f"buffer {name!r}")
            t = self.backend.empty(shape, dtype)
            self._register(name, t, nbytes)
            return t

    def adopt(self, name: str, t, nbytes: int):
        """Make an op's output tensor the buffer `name` (allocated when first written)."""
        if t.untyped_storage().nbytes() != nbytes or not t.is_contiguous():
            t = t.contiguous().clone()  # never keep a larger storage alive under a smaller name
        with self._lock:
            if name in self.tensors:
                raise RuntimeError(f"device buffer {name!r} is already allocated")
            self._charge(nbytes, f"buffer {name!r}")
            self._register(name, t, nbytes)
            return t

    def hold(self, name: str, obj, nbytes: int):
        """Make `obj` (not a tensor: a kept layer's autograd graph, whose saved tensors the op
        that made them allocated) the buffer `name`, charged `nbytes` (its declared size)."""
        with self._lock:
            if name in self.tensors:
                raise RuntimeError(f"device buffer {name!r} is already allocated")
            self._charge(nbytes, f"buffer {name!r}")
            self._register(name, obj, nbytes)
            return obj

    def _register(self, name, t, nbytes):
        self.tensors[name] = t
        self._bytes[name] = nbytes
        if hasattr(t, "untyped_storage"):
            self.ptrs.add(t.untyped_storage().data_ptr())
        self.live += nbytes
        self._logged()
        self._update_peak()

    def free(self, name: str):
        with self._lock:
            t = self.tensors.pop(name)
            if hasattr(t, "untyped_storage"):
                self.ptrs.discard(t.untyped_storage().data_ptr())
            self.live -= self._bytes.pop(name)
            self._logged()
        return t

    def charged_bytes(self, name: str) -> int:
        """The bytes `name` (a live buffer) is charged: its declared size, which `live` sums."""
        return self._bytes[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors
