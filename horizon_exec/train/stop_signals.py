"""SIGINT/SIGTERM/SIGHUP around work that must end cleanly (a training loop, an HF save): the first
signal is recorded and the work is asked to stop at its next safe point; a second one raises
at once, and the work's own cleanup (a staging folder's removal, a checkpoint abandoned under
its temporary name) runs as the exception unwinds. The process then exits 128 + the signal
(130, 143, 129). Handlers are installed only in the main thread (Python delivers signals there).
SIGHUP (the terminal or ssh session went away) is a stop request like SIGTERM: its default
action killed the run at once, losing everything since the last checkpoint.
A signal the process was started ignoring stays ignored (ignored()): `nohup horizon train`
ignores SIGHUP so that the run outlives the terminal, and a non-interactive shell's `&`
ignores SIGINT; a handler installed over that would stop the run the user asked to keep going.
A Ctrl-C pressed during the `horizon` program's start-up whose KeyboardInterrupt was swallowed
(horizon_sim/cli/ctrl_c.py) is taken by the first StopSignals entered as its first signal.
"""
import os
import signal
import threading

from horizon_sim.cli import ctrl_c

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def ignored(sig: int) -> bool:
    """Whether this process ignores `sig` as whoever started it asked (SIG_IGN), not because
    the program's own Ctrl-C handling ignores SIGINT after a press during start-up (ctrl_c.py:
    that press is this run's first SIGINT, and a second one must still abort)."""
    ours = sig == signal.SIGINT and ctrl_c.seen()
    return signal.getsignal(sig) is signal.SIG_IGN and not ours


class StopSignals:
    """with StopSignals(on_first, on_second) as s: ... ; s.signum: the first signal, or None.

    on_first(signum): called in the handler for the first signal (keep it short: set flags,
    os.write); on_second(signum): called for any later one, and expected to raise."""

    def __init__(self, on_first, on_second, enabled: bool = True):
        self.on_first, self.on_second, self.enabled = on_first, on_second, enabled
        self.signum: int | None = None
        self._old: dict = {}

    def _handler(self, signum, frame):
        if self.signum is None:
            self.signum = signum
            self.on_first(signum)
            return
        self.on_second(signum)

    def __enter__(self):
        if self.enabled and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if not ignored(sig):  # nohup's SIGHUP: the user asked the run to outlive it
                    self._old[sig] = signal.signal(sig, self._handler)
            if ctrl_c.take_swallowed():  # Ctrl-C during start-up whose KeyboardInterrupt was caught
                self._handler(signal.SIGINT, None)
        return self

    def __exit__(self, *exc):
        for sig, h in self._old.items():
            signal.signal(sig, h)
        self._old = {}


def say(msg: str) -> None:
    """A line on stderr from a signal handler (os.write, not print: the handler may run in the
    middle of a print)."""
    try:
        os.write(2, msg.encode())
    except OSError:
        pass


def name(signum: int) -> str:
    return signal.Signals(signum).name
