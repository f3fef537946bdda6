"""Files the executor writes: safetensors streamed one tensor at a time, SHA-256 per file, and
atomic publication (write under a temporary name, fsync, rename).

`write_safetensors` emits the format safetensors and transformers read (8-byte little-endian
header length, a JSON header padded with spaces to 8 bytes, then the raw little-endian data)
without ever materialising the whole file: each tensor is cast (if asked) and written on its
own, so saving a store costs one tensor of extra memory, not a copy of the model
(`safetensors.torch.save_file` would serialise every tensor into memory first, and refuses
views that share one allocation, which is what the host store is made of).
"""
import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from horizon_exec.procfs import umask
from horizon_sim.errors import HorizonError
from horizon_sim.units import fmt_bytes

ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
            torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
            torch.uint8: "U8", torch.bool: "BOOL"}


# What an OSError means for an output, in the words of a one-line message.
_WHY = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
        errno.EFBIG: "file size limit reached (ulimit -f)", errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
        errno.ENOENT: "no such file or folder", errno.ENOTDIR: "a file where a folder is expected",
        errno.EISDIR: "a folder where a file is expected", errno.EEXIST: "already exists",
        errno.ENAMETOOLONG: "name too long", errno.ELOOP: "too many symbolic links"}
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""Errors that more room (space, quota, file size limit) would cure."""


def os_error_text(e: OSError) -> str:
    """'read-only file system (/mnt/x/.tmp)': what went wrong and on which path."""
    why = _WHY.get(e.errno) or e.strerror or str(e) or type(e).__name__
    return why + (f" ({e.filename})" if e.filename else "")


class OutputError(HorizonError):
    """An output could not be written (disk full, quota, file size limit, read-only, a bad
    path); the message names the path and what it needed, and says what is still intact."""


def write_failure(what: str, e: OSError, folder, need_bytes: int | None = None) -> str:
    """'cannot write <what>: <why>; it needs about N (F free there)': the need is stated
    when more room would cure the error (need_bytes None: just the room left)."""
    msg = f"cannot write {what}: {os_error_text(e)}"
    if e.errno in FULL:
        try:
            st = os.statvfs(folder)
            free = f"{fmt_bytes(st.f_bavail * st.f_frsize)} free there"
        except OSError:
            free = "free space unknown"
        if e.errno == errno.EFBIG:
            free = "raise the limit"
        msg += f"; it needs about {fmt_bytes(need_bytes)} ({free})" if need_bytes else f" ({free})"
    return msg


@dataclass(frozen=True)
class Deferred:
    """A tensor that exists only while its bytes are written or read, one at a time (a split
    master's fp32 view: never the whole model's at once). Writing calls make() for the data;
    reading reads into a new tensor of its shape and dtype, then hands it to done()."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]
    done: Callable[[torch.Tensor], None] | None = None

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


def _nbytes(t: torch.Tensor, dtype) -> int:
    return t.numel() * torch.empty((), dtype=dtype).element_size()


def write_safetensors(path, items, metadata: dict | None = None) -> str:
    """Write `items` [(name, tensor, dtype or None)] (CPU tensors or Deferred; dtype None keeps
    the tensor's) to `path`; returns the file's SHA-256 (hex), computed while writing."""
    header, off = {}, 0
    for name, t, dt in items:
        dt = dt or t.dtype
        n = _nbytes(t, dt)
        header[name] = {"dtype": ST_DTYPE[dt], "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-(8 + len(hb)) % 8)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(hb)), hb):
            f.write(chunk)
            h.update(chunk)
        for name, t, dt in items:
            t = (t.make() if isinstance(t, Deferred) else t).detach()
            if dt is not None and dt != t.dtype:
                t = t.to(dt)                                  # one tensor's worth of memory
            b = t.contiguous().reshape(-1).view(torch.uint8).numpy()
            f.write(memoryview(b))
            h.update(memoryview(b))
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


def sha256_file(path, bufsize: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def write_text(path, text: str) -> str:
    """Write and fsync a text file; returns its SHA-256."""
    data = text.encode()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


# ---- temporary names, and leftovers of killed runs ------------------------------------------
# Every temporary name carries its owner, `.<final name>.<host>-<pid>.<...>`, so a run removes
# only leftovers it can prove dead (its own, or a process of this host that no longer
# exists), never another live run's folder in flight.
def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"


def owner_tag() -> str:
    """This process's part of a temporary name: <host>-<pid>."""
    return f"{_host()}-{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # EPERM: it exists, as another user
        return True
    return True


def remove_dead_leftovers(folder, stem: str) -> list[Path]:
    """Remove the hidden temporaries `.<name>.<host>-<pid>.(<x>.tmp|old)` in `folder` whose
    name matches the regex `stem` and whose owner is this process or a dead process of this
    host; returns what was removed. Leftovers of other hosts are left alone (their owner's
    life cannot be told from here)."""
    pat = re.compile(rf"\.(?:{stem})\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)\.(?:[^.]+\.tmp|old)")
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    me, host = os.getpid(), _host()
    for p in entries:
        m = pat.fullmatch(p.name)
        if not m or m["host"] != host or (int(m["pid"]) != me and _pid_alive(int(m["pid"]))):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
        removed.append(p)
    return removed


def atomic_write_text(path, text: str) -> None:
    """Replace `path` with `text` atomically (temporary file in the same folder + rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{owner_tag()}.", suffix=".tmp", dir=path.parent)
    try:  # mkstemp makes it 0600; the published file is an ordinary one (0666 & ~umask)
        os.fchmod(fd, 0o666 & ~umask())
    finally:
        os.close(fd)
    try:
        write_text(tmp, text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def make_dirs(path: Path) -> None:
    """mkdir -p, each new folder made durable (its parent fsynced): a checkpoint folder
    must not vanish with the folder that holds it after a power loss."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            if not d.is_dir():
                raise
        fsync_dir(d.parent)


def fsync_dir(d) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def staging_dir(final):
    """Yield a fresh temporary folder next to `final` (same filesystem, hidden name owned by
    this process); on an exception it is removed and `final` is untouched. Publishing is the
    caller's rename. Dead runs' leftovers of `final` are removed first."""
    final = Path(final)
    make_dirs(final.parent)
    remove_dead_leftovers(final.parent, re.escape(final.name))
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.{owner_tag()}.", suffix=".tmp", dir=final.parent))
    try:
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes it 0700; the published folder is an ordinary one
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then each folder bottom-up (its entries). Files the
    writers already fsynced cost nothing more; copied ones (e.g. tokenizer files) are made
    durable here."""
    for d, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(d)


def aside_name(folder: Path) -> Path:
    """Where `folder` is renamed before it is deleted (this process's hidden name)."""
    return folder.parent / f".{folder.name}.{owner_tag()}.old"


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename the finished folder `tmp` to `final`, its files and itself fsynced first and the
    parent after. An existing `final` is first renamed aside and removed after, so a crash
    (or a power loss) leaves either the old or the new folder complete under the final name
    (plus, at worst, a hidden leftover)."""
    final = Path(final)
    sync_tree(tmp)   # power loss: the contents are on disk before the name says they are complete
    old = None
    if final.exists():
        old = aside_name(final)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
