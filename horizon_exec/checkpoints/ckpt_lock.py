"""One training run per checkpoint folder: an advisory lock on `<ckpt_dir>/.lock`.

Two runs writing one --ckpt-dir would prune each other's checkpoints and repoint `latest` at
each other's steps. A run (TrainLoop with a ckpt_dir, or one save_checkpoint call) holds an
exclusive flock on the folder's `.lock` file for as long as it uses the folder; the file
says who holds it (pid, host, start time), so a second run is refused naming the first. The
kernel drops the lock when its holder dies, even by kill -9, so a stale lock never blocks a
resume. The lock is per process and re-entrant: a TrainLoop and the saves it makes share it.
(flock works across hosts on NFSv4 and most cluster file systems; where it does not, the
folder is not protected.)

The --save-hf folder is locked the same way for a whole run (acquire_save: `.<name>.lock`
beside it, since the save replaces the folder; removed at the end), so two runs saving to one folder
cannot both report success while one's weights are gone. A lock file is opened without
following a symbolic link (a `.lock` pointing elsewhere would have that file truncated) and
without blocking (a FIFO there would hang the open); anything but a regular file is refused.
"""
import contextlib
import datetime
import fcntl
import os
import socket
import stat
import threading
from pathlib import Path

from horizon_exec.checkpoints.fileio import os_error_text
from horizon_sim.errors import HorizonError

LOCK = ".lock"
_mutex = threading.Lock()
_held: dict[str, list] = {}   # real path of the folder -> [fd, holders, lock file to remove at the end or None]


class CkptDirBusy(HorizonError):
    """Another process holds the checkpoint folder's lock."""


def _key(folder: Path) -> str:
    return os.path.realpath(folder)


def acquire(folder) -> str:
    """Take (or re-enter) the lock of `folder`, which must exist; returns the key to release."""
    folder = Path(folder)
    return _acquire(folder / LOCK, _key(folder), f"checkpoint folder {str(folder)!r}",
                    "wait for it to end or use another --ckpt-dir", CkptDirBusy)


def save_lock_path(out) -> Path:
    """The lock file of a --save-hf folder: beside it (the save replaces the folder)."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


def acquire_save(out) -> str:
    """Take the lock of the --save-hf folder `out` (its parent must exist) for this run;
    returns the key to release. Another run saving to the same folder is refused, named."""
    path = save_lock_path(out)
    return _acquire(path, _key(path), f"--save-hf {str(out)!r}",
                    "wait for it to end or save to another folder", HorizonError, remove=True)


def _open_lock(path: Path, what: str) -> int:
    """The lock file, opened read-write (created 0666 & ~umask when missing), never through a
    symbolic link, never blocking; anything but a regular file is refused."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if os.path.islink(path):
            raise HorizonError(f"{what}: its lock file {str(path)!r} is a symbolic link; a lock is never "
                               "followed (it would overwrite the file it points to): remove the link") from None
        raise HorizonError(f"{what}: cannot create its lock file: {os_error_text(e)}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise HorizonError(f"{what}: its lock file {str(path)!r} is not a regular file; remove it")
    os.set_blocking(fd, True)
    return fd


def _acquire(path: Path, key: str, what: str, advice: str, busy, remove: bool = False) -> str:
    """remove: the lock file goes when the lock is released (beside --save-hf: no litter next
    to the saved folder); a taker then checks that the file it locked is still the one at
    `path`, else it locked a removed file and tries again."""
    with _mutex:
        if key in _held:
            _held[key][1] += 1
            return key
        while True:
            fd = _open_lock(path, what)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that did not say who"
                os.close(fd)
                raise busy(f"{what} is in use by another run ({holder}; lock {path}); {advice}") from None
            except OSError as e:
                os.close(fd)
                raise HorizonError(f"{what}: cannot lock {path}: {os_error_text(e)}") from None
            if not remove or _same_file(fd, path):
                break
            os.close(fd)   # its holder removed it while this process waited to open it
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        with contextlib.suppress(OSError):  # who holds it is information; the flock is the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}, since {started}\n".encode(), 0)
        _held[key] = [fd, 1, path if remove else None]
        return key


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def release(key: str) -> None:
    with _mutex:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            if entry[2] is not None:  # removed while still locked: a waiter sees it gone and retries
                with contextlib.suppress(OSError):
                    os.unlink(entry[2])
            os.close(entry[0])   # drops the flock; a ckpt .lock stays (removing it would race a waiter)


@contextlib.contextmanager
def holding(folder):
    key = acquire(folder)
    try:
        yield
    finally:
        release(key)
