"""Measured device temporaries on the CPU backend: a TorchDispatchMode, active on the compute
lane during one op, that charges the arena for every storage an aten op freshly allocates and
releases the charge when that storage is freed (a weakref on the storage object, which PyTorch
keeps unique per storage). Outputs that alias an input (views, in-place and out= ops, per the
op schema) and the arena's own buffers are not temporaries and are not counted. A kernel
that allocates inside one aten op (logsumexp) is charged its known scratch while it runs
(_INTERNAL).
"""
import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

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


class TransientTracker(TorchDispatchMode):
    def __init__(self, arena, what: str = "op"):
        super().__init__()
        self.arena = arena
        self.what = what
        self.live = 0
        self.peak = 0
        self._refs: dict[int, weakref.ref] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inner = _INTERNAL.get(func)
        inner = inner(args) if inner is not None and not self._closed else 0
        if inner:  # what the kernel allocates inside (invisible here), live while it runs
            with self._lock:
                self.peak = max(self.peak, self.live + inner)
            self.arena.transient(inner, f"a temporary of {self.what}")
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            if inner:
                self.arena.transient(-inner)
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
        self.arena.transient(n, f"a temporary of {self.what}")

    def _freed(self, key: int, n: int) -> None:
        with self._lock:
            if self._closed or self._refs.pop(key, None) is None:
                return
            self.live -= n
        self.arena.transient(-n)

    def close(self) -> None:
        """Stop counting: whatever the op left alive is now a named buffer or garbage."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            n, self.live = self.live, 0
            self._refs.clear()
        self.arena.transient(-n)

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.close()
