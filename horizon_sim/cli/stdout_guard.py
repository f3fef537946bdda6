"""stdout for a command whose product is not its output (`horizon train`): when stdout fails
(the reader left, `horizon train | head -3`; or a file on a full disk), the command goes on
with its output dropped and says so once on stderr, instead of stopping.

Why go on rather than stop: a training run's product is its checkpoints and --save-hf folder;
its progress lines are a view of it. Stopping on a closed pipe would throw away the work
since the last checkpoint because someone stopped reading, and a run that completes has
succeeded, whatever happened to its progress lines, so the exit status stays the run's own.
stderr is guarded the same way (the progress bar draws there: `horizon train 2>&1 >/dev/null |
head -c 10` killed the run at its first redraw), silently: there is nowhere left to say it.

reopen_closed_std_fds: a command started with a standard descriptor closed (`horizon train >&-`)
had sys.stdout None (an AttributeError at its first print) and would hand that descriptor's
number to the next file it opened (a checkpoint written where output goes): the entry point
puts /dev/null on any of 0-2 that is closed before anything else runs.
"""
import contextlib
import os
import sys


class _Guarded:
    """Wraps a text stream: write/flush never raise OSError; the first failure redirects the
    stream's file descriptor to /dev/null (so what is buffered and what comes later is
    dropped, also at interpreter exit) and calls `on_drop(error)`."""

    def __init__(self, inner, on_drop):
        self._inner, self._on_drop, self.dropped = inner, on_drop, False

    def _fail(self, e: OSError) -> None:
        if self.dropped:
            return
        self.dropped = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = self._inner.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        self._on_drop(e)

    def write(self, s: str) -> int:
        if not self.dropped:
            try:
                return self._inner.write(s)
            except OSError as e:
                self._fail(e)
        return len(s)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except OSError as e:
            self._fail(e)
            with contextlib.suppress(OSError):
                self._inner.flush()  # now into /dev/null: the buffer empties

    def __getattr__(self, name):
        return getattr(self._inner, name)


def reopen_closed_std_fds() -> None:
    """/dev/null on each of fds 0, 1, 2 that is closed, and sys.stdin/stdout/stderr over them
    where Python left None (module docstring)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False, errors="backslashreplace" if fd == 2 else None))


@contextlib.contextmanager
def keep_running_without_stdout(cmd: str):
    """sys.stdout and sys.stderr guarded (module docstring) for the duration; one note on
    stderr when stdout fails."""
    def note(e: OSError) -> None:
        why = "the reader closed it" if isinstance(e, BrokenPipeError) else (e.strerror or str(e))
        with contextlib.suppress(OSError):
            print(f"horizon {cmd}: stdout failed ({why}); carrying on, its output is dropped "
                  f"(stderr and the output files are unaffected)", file=sys.stderr, flush=True)

    old, old_err = sys.stdout, sys.stderr
    guarded = _Guarded(old, note)
    sys.stdout = guarded
    sys.stderr = guarded_err = _Guarded(old_err, lambda e: None)
    try:
        yield guarded
    finally:
        guarded.flush()
        guarded_err.flush()
        sys.stdout, sys.stderr = old, old_err
