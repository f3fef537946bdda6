"""The disk tier's file: the Schedule's Space.DISK buffers (the Adam moments under policy
disk_tier='moments'), each at a 4 KiB-aligned offset of one file on local disk.

The file is scratch, never a source of truth across runs: it is created in `folder` and
unlinked at once, so it lives exactly as long as the process (a crash leaves no file and no
disk space behind) and a checkpoint copies the moments out of it (ckpt.py, a unit at a time).
A resumed run writes them back from the checkpoint, so the disk state can never disagree with
the checkpoint it resumed from. Space is reserved up front (posix_fallocate): a full disk is a
one-line error at start, not a failed write mid-step. New moments are zero (fallocate's
blocks read as zeros).

How bytes move (`method`; benchmarks/disk_tier.py measures them side by side):
  direct    O_DIRECT pread/pwrite straight between the file and the RAM stage: the disk DMAs,
            nothing goes through the page cache (which would hold a second copy of the moments
            in RAM, the very memory the tier is there to free, and cost a memcpy each way). The
            stage must be 4 KiB-aligned (the host pool's large blocks are page-aligned mmaps);
            an unaligned head or tail goes through a small aligned bounce buffer.
  buffered  plain pread/pwrite through the page cache (file systems without O_DIRECT: tmpfs);
            after each read and write the unit's pages are dropped (fdatasync, POSIX_FADV_DONTNEED).
  mmap      the file mapped, copied with torch: every touched page is resident and counts in
            the process's RSS until evicted (benchmark only).
"""
import mmap
import os
import tempfile

import torch

from horizon_exec.errors import ExecError
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import Space
from horizon_sim.units import fmt_bytes

BLOCK = 4096
"""O_DIRECT's alignment: file offsets, lengths and memory addresses in multiples of it."""
BOUNCE_BYTES = 4 << 20
"""The aligned bounce buffer for unaligned heads and tails (and unaligned stages)."""
METHODS = ("direct", "buffered", "mmap")


def _up(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def disk_buffers(sched) -> dict[str, int]:
    """{name: bytes} of a Schedule's Space.DISK buffers."""
    return {name: b.bytes for name, b in sched.buffers.items() if b.space == Space.DISK}


class DiskStore:
    def __init__(self, sizes: dict[str, int], folder, method: str = "direct"):
        """sizes: {buffer name: bytes} (disk_buffers(sched)); folder: where the file goes."""
        if method not in METHODS:
            raise HorizonError(f"disk tier method {method!r}; allowed: {', '.join(METHODS)}")
        self.offsets, total = {}, 0
        for name, n in sizes.items():
            self.offsets[name] = (total, n)
            total += _up(n)
        self.nbytes, self.folder = total, str(folder)
        if not os.path.isdir(self.folder):
            raise HorizonError(f"disk tier folder {self.folder!r} " + ("is not a folder" if os.path.exists(self.folder)
                                                                       else "does not exist") + " (--disk-dir)")
        try:
            fd, path = tempfile.mkstemp(prefix="horizon-disk-tier-", dir=self.folder)
        except OSError as e:
            raise HorizonError(f"cannot create the disk tier's file in {self.folder!r}: {e.strerror}") from None
        os.unlink(path)  # the file dies with the process: no state outlives it (see the top)
        try:
            os.posix_fallocate(fd, 0, max(total, 1))
        except OSError as e:
            os.close(fd)
            raise HorizonError(f"the disk tier needs {fmt_bytes(total)} in {self.folder!r}: {e.strerror}") from None
        self.method = method
        if method == "direct":
            try:
                dfd = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_DIRECT)
                os.close(fd)
                fd = dfd
            except OSError:  # no O_DIRECT on this file system (tmpfs): through the page cache
                self.method = "buffered"
        self.fd = fd
        self._map = mmap.mmap(fd, total) if self.method == "mmap" and total else None
        self._bounce = mmap.mmap(-1, BOUNCE_BYTES)  # page-aligned, for O_DIRECT's odd pieces
        self._bounce_t = torch.frombuffer(self._bounce, dtype=torch.uint8)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _where(self, name: str, t: torch.Tensor) -> tuple[int, torch.Tensor]:
        off, n = self.offsets[name]
        if t.numel() * t.element_size() != n or not t.is_contiguous() or t.device.type != "cpu":
            raise ExecError(f"disk tier: {name!r} is {n} bytes; got {tuple(t.shape)} {t.dtype} on {t.device}")
        return off, t.view(-1).view(torch.uint8)

    def read(self, name: str, t: torch.Tensor) -> None:
        """Buffer `name` from the file into `t` (a CPU tensor of its size)."""
        self._at(os.preadv, *self._where(name, t))

    def write(self, name: str, t: torch.Tensor) -> None:
        """`t` into buffer `name`'s place in the file."""
        self._at(os.pwritev, *self._where(name, t))

    def zero(self, name: str) -> None:
        """Buffer `name` to zeros (optimizer state reset)."""
        off, n = self.offsets[name]
        z = torch.zeros(min(n, BOUNCE_BYTES), dtype=torch.uint8)
        for s in range(0, n, z.numel()):
            self._at(os.pwritev, off + s, z[:min(z.numel(), n - s)])

    def _at(self, call, off: int, b: torch.Tensor) -> None:
        """os.preadv or os.pwritev of the bytes b at file offset off, by this store's method."""
        if self._map is not None:
            mapped = torch.frombuffer(self._map, dtype=torch.uint8, count=b.numel(), offset=off)
            if call is os.preadv:
                b.copy_(mapped)
            else:
                mapped.copy_(b)
            return
        self._io(call, off, b)
        if self.method == "buffered":  # drop the unit's pages: the page cache would hold them in RAM
            if call is os.pwritev:
                os.fdatasync(self.fd)  # dirty pages are not dropped
            os.posix_fadvise(self.fd, off, b.numel(), os.POSIX_FADV_DONTNEED)

    def _io(self, call, off: int, b: torch.Tensor) -> None:
        """pread/pwrite all of b at file offset off; under O_DIRECT the aligned middle goes
        straight from or to b, the rest through the bounce buffer."""
        n = b.numel()
        if self.method == "direct" and b.data_ptr() % BLOCK:  # b unaligned: all through the bounce buffer
            self._bounced(call, off, b)
            return
        body = n // BLOCK * BLOCK if self.method == "direct" else n
        done = 0
        while done < body:
            mv = memoryview(b[done:body].numpy())
            got = call(self.fd, [mv], off + done)
            if got <= 0:
                raise ExecError(f"disk tier: {call.__name__} returned {got} at offset {off + done}")
            done += got
        if done < n:  # the tail under O_DIRECT: a whole block through the bounce buffer
            self._bounced(call, off + done, b[done:])

    def _bounced(self, call, off: int, b: torch.Tensor) -> None:
        n = b.numel()
        for s in range(0, n, BOUNCE_BYTES):
            k = min(BOUNCE_BYTES, n - s)
            span = _up(k)  # whole blocks: the file's regions are padded to BLOCK
            if call is os.pwritev:
                self._bounce_t[:k].copy_(b[s:s + k])
                if span > k:
                    self._bounce_t[k:span].zero_()
            got = call(self.fd, [memoryview(self._bounce)[:span]], off + s)
            if got < k:
                raise ExecError(f"disk tier: {call.__name__} returned {got} of {span} bytes at offset {off + s}")
            if call is os.preadv:
                b[s:s + k].copy_(self._bounce_t[:k])
