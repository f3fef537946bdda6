"""`horizon train` (tiny, as the `horizon` program) whose first op stalls inside a native call
-- the way a torch kernel hangs: the GIL released, no cancellation -- until the interpreter
tears down, when it returns (as a hung kernel that finally finishes would). In that teardown
CPython ends the lane thread with pthread_exit, whose unwind through torch's C++ frames called
std::terminate: SIGABRT after the op timeout's one line (issue 43, item 5).
Usage: python tests/stall_native_op.py [--as-rank-module] <horizon train flags>
(--as-rank-module: the end of `python -m horizon_exec.cli.train_cmd`, exit_rank, not the program's.)"""
import sys

AS_RANK_MODULE = sys.argv[1:2] == ["--as-rank-module"]
if not AS_RANK_MODULE:
    sys.argv[0] = "/usr/local/bin/horizon"  # before the entry point is imported: it acts as the program

import torch  # noqa: E402

from horizon_exec.runtime.engine import Engine  # noqa: E402
from horizon_sim.cli.main import main  # noqa: E402

RETURN = torch.futures.Future()   # Future.wait() blocks in C++, the GIL released, until it is set


class _StdoutThatEndsTheStall:
    """sys.stdout, whose flush sets RETURN once the interpreter is finalizing: its teardown
    flushes the standard streams right after it stopped every other thread from taking the GIL."""

    def __init__(self, inner):
        self._inner = inner

    def write(self, s):
        return self._inner.write(s)

    def flush(self):
        self._inner.flush()
        if sys.is_finalizing() and not RETURN.done():
            RETURN.set_result(None)

    def __getattr__(self, name):
        return getattr(self._inner, name)


sys.stdout = _StdoutThatEndsTheStall(sys.stdout)
_real_init = Engine.__init__


def _init(self, *a, **kw):
    _real_init(self, *a, **kw)
    stalled = []

    def hook(op):
        if not stalled:  # the first op of the first step: no other op can have timed out before
            stalled.append(op)
            RETURN.wait()
    self.hook = hook


Engine.__init__ = _init
if AS_RANK_MODULE:  # not the program: exit_rank is this process's only way out
    from horizon_exec.dist.context import exit_rank
    exit_rank(main(["train", *sys.argv[2:]]))
sys.exit(main(["train", *sys.argv[1:]]))
