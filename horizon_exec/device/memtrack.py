"""Measured device temporaries on the CPU backend: a TorchDispatchMode, active on the compute
lane during one op, that charges the arena for every storage an aten op freshly allocates and
releases the charge when that storage is freed (a weakref on the storage object, which PyTorch
keeps unique per storage). Outputs that alias an input (views, in-place and out= ops, per the
op schema) and the arena's own buffers are not temporaries and are not counted. A kernel
that allocates inside one aten op (logsumexp) is charged its known scratch while it runs
(_INTERNAL).

The mode sees every aten op from Python (~20 us each: ~30% of a small model's step), so an op
whose temporaries cannot change between runs is tracked once (RuntimeConfig.track_memory): the
tracker also keeps their level over the op's run as a TempProfile, and later runs replay it on
their own clock against the buffers the other lanes held meanwhile (TempProfile.replay_peak).
"""
import threading
import time
import weakref
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from horizon_exec.device.dispatch_mode import UncompiledDispatchMode

_FRESH: dict = {}  # op overload -> indices of outputs that are fresh allocations


def _fresh_outputs(func) -> tuple[int, ...]:
    idx = _FRESH.get(func)
    if idx is None:
        try:
            idx = tuple(i for i, r in enumerate(func._schema.returns) if r.alias_info is None)
        except AttributeError:
            idx = ()
        _FRESH[func] = idx
    return idx


_INTERNAL = {
    # logsumexp exponentiates x - max(x), a fresh tensor of x's size, inside one aten op
    # (measured: 4 B per fp32 logit above the logits; the head's loss, issue 30)
    torch.ops.aten.logsumexp.default: lambda args: args[0].numel() * args[0].element_size(),
}
"""aten op -> bytes its kernel allocates internally (below this mode: not seen as outputs)."""


SLICES = 32
"""A TempProfile's resolution: the op's run in this many equal slices of time."""


def _slice_maxima(t0: float, t1: float, level0: int, changes) -> list[int]:
    """The most of a step function in each of SLICES equal slices of [t0, t1]: `level0` at t0,
    then (t, level) from each change on (changes in time order)."""
    span = max(t1 - t0, 1e-12)
    out = [0] * SLICES

    def at(t):
        return min(SLICES - 1, max(0, int((t - t0) / span * SLICES)))

    points = [(t0, level0), *changes, (t1, None)]
    for (ta, level), (tb, _) in zip(points, points[1:]):
        for i in range(at(ta), at(tb) + 1):
            out[i] = max(out[i], level)
    return out


@dataclass(frozen=True, slots=True)
class TempProfile:
    """An op's temporaries as measured over one run: the most live in each of SLICES equal
    slices of its run. The device's other lanes run concurrently, so the peak that matters is
    the temporaries plus the buffers live at the same moment, not at the op's start: a backward
    starts while the previous layer's gradient is still on its way out, and its temporaries
    peak after that gradient has gone."""
    peak: int
    slices: tuple[int, ...]

    @staticmethod
    def of(t0: float, t1: float, changes) -> "TempProfile":
        """From a tracked run over [t0, t1]: none live at t0, then (t, bytes live) per change."""
        s = _slice_maxima(t0, t1, 0, changes)
        return TempProfile(max(s), tuple(s))

    def replay_peak(self, t0: float, t1: float, live0: int, live_changes) -> int:
        """The most device memory a run over [t0, t1] held: the named buffers (live0 at t0, then
        (t, live) per change, the arena's) plus these temporaries, slice by slice of its run."""
        live = _slice_maxima(t0, t1, live0, live_changes)
        return max(a + b for a, b in zip(live, self.slices))


class TransientTracker(UncompiledDispatchMode):
    def __init__(self, arena, what: str = "op"):
        super().__init__()
        self.arena = arena
        self.what = what
        self.live = 0
        self.peak = 0
        self._refs: dict[int, weakref.ref] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._t0 = self._t1 = 0.0
        self._changes: list[tuple[float, int]] = []  # (time, bytes live incl. a kernel's scratch)

    def __enter__(self):
        self._t0 = time.perf_counter()
        return super().__enter__()

    @property
    def profile(self) -> TempProfile:
        """The temporaries over the op's run (once closed)."""
        return TempProfile.of(self._t0, self._t1, self._changes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inner = _INTERNAL.get(func)
        inner = inner(args) if inner is not None and not self._closed else 0
        if inner:  # what the kernel allocates inside (invisible here), live while it runs
            with self._lock:
                self.peak = max(self.peak, self.live + inner)
                self._changes.append((time.perf_counter(), self.live + inner))
            self.arena.transient(inner, f"a temporary of {self.what}")
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            if inner:
                self.arena.transient(-inner)
                with self._lock:
                    self._changes.append((time.perf_counter(), self.live))
        idx = _fresh_outputs(func)
        if idx and not self._closed:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for i in idx:
                if i < len(outs):
                    for t in tree_leaves(outs[i]):
                        if isinstance(t, torch.Tensor):
                            self._track(t)
        return out

    def _track(self, t) -> None:
        st = t.untyped_storage()
        key, n = st.data_ptr(), st.nbytes()
        if n == 0 or key in self._refs or key in self.arena.ptrs:
            return
        with self._lock:
            self._refs[key] = weakref.ref(st, lambda _r, key=key, n=n: self._freed(key, n))
            self.live += n
            self.peak = max(self.peak, self.live)
            self._changes.append((time.perf_counter(), self.live))
        self.arena.transient(n, f"a temporary of {self.what}")

    def _freed(self, key: int, n: int) -> None:
        with self._lock:
            if self._closed or self._refs.pop(key, None) is None:
                return
            self.live -= n
            self._changes.append((time.perf_counter(), self.live))
        self.arena.transient(-n)

    def close(self) -> None:
        """Stop counting: whatever the op left alive is now a named buffer or garbage."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._t1 = time.perf_counter()
            n, self.live = self.live, 0
            self._refs.clear()
        self.arena.transient(-n)

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.close()
