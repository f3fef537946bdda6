"""One training run per checkpoint folder: an advisory lock on `<ckpt_dir>/.lock`.

Two runs writing one --ckpt-dir would prune each other's checkpoints and repoint `latest` at
each other's steps. A run (TrainLoop with a ckpt_dir, or one save_checkpoint call) holds an
exclusive flock on the folder's `.lock` file for as long as it uses the folder; the file
says who holds it (pid, host, start time), so a second run is refused naming the first. The
kernel drops the lock when its holder dies, even by kill -9, so a stale lock never blocks a
resume. The lock is per process and re-entrant: a TrainLoop and the saves it makes share it.
(flock works across hosts on NFSv4 and most cluster file systems; where it does not, the
folder is not protected.)
"""
import contextlib
import datetime
import fcntl
import os
import socket
import threading
from pathlib import Path

from horizon_exec.files.fileio import os_error_text
from horizon_sim.errors import HorizonError

LOCK = ".lock"
_mutex = threading.Lock()
_held: dict[str, list] = {}   # real path of the folder -> [fd, holders]


class CkptDirBusy(HorizonError):
    """Another process holds the checkpoint folder's lock."""


def _key(folder: Path) -> str:
    return os.path.realpath(folder)


def acquire(folder) -> str:
    """Take (or re-enter) the lock of `folder`, which must exist; returns the key to release."""
    folder = Path(folder)
    key = _key(folder)
    with _mutex:
        if key in _held:
            _held[key][1] += 1
            return key
        path = folder / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise HorizonError(f"checkpoint folder {str(folder)!r}: cannot create its lock file: "
                               f"{os_error_text(e)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that did not say who"
            os.close(fd)
            raise CkptDirBusy(f"checkpoint folder {str(folder)!r} is in use by another run ({holder}; lock "
                              f"{path}); wait for it to end or use another --ckpt-dir") from None
        except OSError as e:
            os.close(fd)
            raise HorizonError(f"checkpoint folder {str(folder)!r}: cannot lock {path}: {os_error_text(e)}") from None
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        with contextlib.suppress(OSError):  # who holds it is information; the flock is the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}, since {started}\n".encode(), 0)
        _held[key] = [fd, 1]
        return key


def release(key: str) -> None:
    with _mutex:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            os.close(entry[0])   # drops the flock; the file stays (removing it would race a waiter)


@contextlib.contextmanager
def holding(folder):
    key = acquire(folder)
    try:
        yield
    finally:
        release(key)
