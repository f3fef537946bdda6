"""Files a user names, checked for their kind before they are opened, and outputs written so
that a failure never leaves half a file behind.

- refuse_non_regular(path, what): a FIFO, socket or block device given where a file is read or
  written is refused with one line. Opening a FIFO blocks until another process opens the
  other end, so a FIFO left as `latest`, `model.safetensors` or `--plot` would hang the run
  forever; nothing Horizon reads or writes is meant to be one. Character devices
  (/dev/null, /dev/stderr, /dev/full) are let through where allow_chardev says so: they never
  block, and `--log-file /dev/null` is a normal thing to ask for.
- write_atomic(path, data, what): bytes written to a temporary file beside `path`, flushed,
  then renamed over it. A full disk (or a crash) leaves the old file, or none, never a
  truncated PNG or trace that looks valid. A character device is written in place (there is
  nothing to rename over: /dev/full must report its error, /dev/null swallow the bytes).
"""
import os
import stat
import tempfile
from pathlib import Path

from horizon_sim.errors import HorizonError

_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket", stat.S_IFBLK: "a block device",
          stat.S_IFCHR: "a character device", stat.S_IFDIR: "a folder"}


def kind_of(path) -> str | None:
    """'a FIFO (named pipe)', 'a socket', ... for a path that exists and is not a regular file
    (symlinks followed); None for a regular file or a path that does not exist."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def is_chardev(path) -> bool:
    """A character device, or a stream this process already holds open (/dev/stderr when
    stderr is a pipe resolves to /proc/<pid>/fd/pipe:[n]: open already, so writing it never
    blocks the way opening a named FIFO does)."""
    try:
        if stat.S_ISCHR(os.stat(path).st_mode):
            return True
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    return real.startswith("/proc/") and ("/fd/pipe:[" in real or "/fd/socket:[" in real)


def refuse_non_regular(path, what: str, allow_chardev: bool = False, allow_dir: bool = False) -> None:
    """HorizonError naming `path` (as `what` calls it) when it exists and is a FIFO, socket,
    block device (or a character device / folder unless allowed); nothing when it is a regular
    file or absent. Checked with stat, never by opening it (opening a FIFO blocks)."""
    k = kind_of(path)
    if k is None or (allow_chardev and is_chardev(path)) or (allow_dir and k == "a folder"):
        return
    raise HorizonError(f"{what} {str(path)!r} is {k}, not a regular file; give a file")


def umask() -> int:
    """The process umask, read without changing it where /proc says it (os.umask sets it, and
    other threads may be creating files meanwhile)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path, data: bytes, what: str) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename (module
    docstring); a character device is written in place. Errors: one-line HorizonError
    '<what> <path>: <reason>'."""
    path = Path(path)
    if is_chardev(path):
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as e:
            raise HorizonError(f"cannot write {what} {str(path)!r}: {e.strerror or e}") from None
        return path
    refuse_non_regular(path, f"cannot write {what}:")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes it 0600; a report is an ordinary file
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise HorizonError(f"cannot write {what} {str(path)!r}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path
