"""The disk tier's disk: how fast the executor's own file I/O (runtime/disk_store.py) writes and
reads units of moments in `folder`, and how much room there is.

A file of `units` regions of `unit_bytes` each is written whole, then read whole, from a
page-aligned stage (as the host pool's large blocks are), `rounds` times; the figures are the
mean over rounds of bytes / time. Under O_DIRECT nothing is served from the page cache, so a
read is the disk's, not RAM's; with the buffered fallback (no O_DIRECT, e.g. tmpfs) the write
drops its pages after each unit, and a read may still be served by the page cache (then the
figure says what this machine will see, a fast tmpfs included). latency_us: one 4 KiB unit's
write + read, halved.
"""
import mmap
import shutil
import statistics
import time

import torch

from horizon_exec.runtime.disk_store import DiskStore
from horizon_sim.units import GiB


def measure_disk(folder, unit_bytes: int = 64 << 20, units: int = 8, rounds: int = 2,
                 method: str = "direct") -> dict:
    """{'read_GBps', 'write_GBps', 'latency_us', 'free_GiB', 'method'} for the disk under `folder`."""
    sizes = {f"u{i}": unit_bytes for i in range(units)}
    sizes["tiny"] = 4096
    d = DiskStore(sizes, folder, method)
    try:
        stage = torch.frombuffer(mmap.mmap(-1, unit_bytes), dtype=torch.uint8)
        stage.fill_(7)  # fault it in: the timed copies move bytes, not page faults
        small = torch.frombuffer(mmap.mmap(-1, 4096), dtype=torch.uint8)
        reads, writes, lat = [], [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for i in range(units):
                d.write(f"u{i}", stage)
            t1 = time.perf_counter()
            for i in range(units):
                d.read(f"u{i}", stage)
            t2 = time.perf_counter()
            writes.append(t1 - t0)
            reads.append(t2 - t1)
            t3 = time.perf_counter()
            d.write("tiny", small)
            d.read("tiny", small)
            lat.append((time.perf_counter() - t3) / 2)
        total = unit_bytes * units
        return {"read_GBps": total / statistics.mean(reads) / 1e9, "write_GBps": total / statistics.mean(writes) / 1e9,
                "latency_us": statistics.median(lat) * 1e6, "free_GiB": shutil.disk_usage(folder).free / GiB,
                "method": d.method}
    finally:
        d.close()


def disk_host_fields(disk: tuple, quick: bool, prog) -> dict:
    """HostSpec's disk fields for disk = (folder or None: the temp dir, I/O method), measured
    (one progress step of `prog`)."""
    import tempfile
    folder, method = disk
    folder = folder or tempfile.gettempdir()
    prog.step(f"the disk tier's disk: units of moments written and read back in {folder}")
    r = measure_disk(folder, unit_bytes=(16 if quick else 64) << 20, units=4 if quick else 8,
                     rounds=1 if quick else 2, method=method)
    prog.done(f"read {r['read_GBps']:.2f} GB/s, write {r['write_GBps']:.2f} GB/s ({r['method']} I/O), "
              f"{r['latency_us']:.0f} us a unit; {r['free_GiB']:.0f} GiB free there")
    return dict(disk_GiB=r["free_GiB"], disk_read_GBps=r["read_GBps"], disk_write_GBps=r["write_GBps"],
                disk_latency_us=r["latency_us"])
