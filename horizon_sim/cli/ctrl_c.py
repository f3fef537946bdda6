"""Ctrl-C once a `horizon` command runs, until it installs its own handling (a training loop's
StopSignals): the program's SIGINT handler (cli/main.py installs it).

The first Ctrl-C raises KeyboardInterrupt, as Python's own handler does, and SIGINT is ignored
from then on: the exception unwinds through the command's cleanup to main's one line and exit
130. A second Ctrl-C in that time (a double press) raised a second KeyboardInterrupt wherever it
landed: in threading's shutdown, an atexit callback, a `__del__` or a finalizer (a traceback),
past main's handler (a traceback), or it killed the process by SIGINT (Python restores SIGINT's
default action early in its teardown).

A KeyboardInterrupt can also be swallowed where it lands: torch's C++ NumPy check catches it
when it lands while NumPy initializes, and the start-up goes on (or fails at NumPy's next
import: main reports that as the interruption). So the press is remembered, and the first
StopSignals to be entered takes it (take_swallowed) as the signal that was asked for.
"""
import signal

_seen = False
_taken = False


def interrupt_once(signum, frame):
    global _seen
    _seen = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def seen() -> bool:
    """Whether Ctrl-C was pressed since the command started (interrupt_once ran)."""
    return _seen


def take_swallowed() -> bool:
    """True once, when Ctrl-C was pressed and the command still runs (its KeyboardInterrupt was
    caught somewhere): the caller acts on it as on a SIGINT."""
    global _taken
    if not _seen or _taken:
        return False
    _taken = True
    return True
