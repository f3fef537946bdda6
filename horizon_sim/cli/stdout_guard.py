"""stdout for a command whose product is not its output (`horizon train`): when stdout fails
(the reader left, `horizon train | head -3`; or a file on a full disk), the command goes on
with its output dropped and says so once on stderr, instead of stopping.

Why go on rather than stop: a training run's product is its checkpoints and --save-hf folder;
its progress lines are a view of it. Stopping on a closed pipe would throw away the work
since the last checkpoint because someone stopped reading, and a run that completes has
succeeded, whatever happened to its progress lines, so the exit status stays the run's own.
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


@contextlib.contextmanager
def keep_running_without_stdout(cmd: str):
    """sys.stdout guarded (module docstring) for the duration; one note on stderr when it fails."""
    def note(e: OSError) -> None:
        why = "the reader closed it" if isinstance(e, BrokenPipeError) else (e.strerror or str(e))
        with contextlib.suppress(OSError):
            print(f"horizon {cmd}: stdout failed ({why}); carrying on, its output is dropped "
                  f"(stderr and the output files are unaffected)", file=sys.stderr, flush=True)

    old = sys.stdout
    guarded = _Guarded(old, note)
    sys.stdout = guarded
    try:
        yield guarded
    finally:
        guarded.flush()
        sys.stdout = old
