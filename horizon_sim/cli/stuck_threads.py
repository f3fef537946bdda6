"""Threads left inside a call that cannot be interrupted, and how the `horizon` program ends
while one is still there.

The executor gives up a step whose op makes no progress (the op timeout, a stop request that
waited STOP_GRACE_S, a lane that did not drain after another failed): the lane running it is
inside a torch kernel, which checks for no cancellation, so it is left to finish on its own
(horizon_exec/runtime/engine.py notes it here when it closes). If the process then ends the
usual way, CPython's teardown ends that thread when its kernel returns and it asks for the GIL
back: 3.11 calls pthread_exit there, whose forced unwind through torch's C++ frames (a noexcept
gil_scoped_release destructor) calls std::terminate: "terminate called without an active
exception", SIGABRT, exit 134 instead of the run's own code and one line.

So the program, once its command has returned (every `with` and `finally` of the run done:
checkpoints, log lines and locks written and released), flushes its output and leaves with
os._exit when such a thread is still alive, skipping a teardown that cannot work. Torch-free
and light (the entry point imports it before the command's modules).
"""
import os
import sys

_noted: list = []
"""(threading.Thread, what it is inside) for each thread noted."""


def note(thread, what: str) -> None:
    """`thread` was left running inside `what` (e.g. 'lane compute in op 5 forward[0]')."""
    _noted.append((thread, what))


def still_running() -> list[str]:
    """What each noted thread that has not ended yet is inside."""
    return [what for t, what in _noted if t.is_alive()]


def exit_past_stuck_threads(rc: int) -> None:
    """Leave the process now with `rc` when a noted thread is still running (after flushing the
    standard streams and the logging handlers); return, for the usual exit, when none is."""
    if not still_running():
        return
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError, AttributeError):  # closed, or None: nothing can be written
            pass
    logging = sys.modules.get("logging")  # its handlers' buffers, where the command used any
    if logging is not None:
        try:
            logging.shutdown()
        except Exception:
            pass
    os._exit(rc)
