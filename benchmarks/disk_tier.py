"""Benchmark: the disk tier's ways of moving a unit's moments between RAM and the file
(runtime/disk_store.py: O_DIRECT, buffered pread/pwrite, mmap), side by side on this machine's
disk, and what each leaves resident in RAM (issue 18's "direct I/O or memory mapping: measure
which is faster here and say why").

Each method runs in a process of its own: `--units` units of `--unit-MiB` are written and read
back whole, `--rounds` times, alternating the methods; rates are the median over rounds of bytes
/ time. Beside the rates: how much the process's RSS grew (VmRSS) and how much the page cache
grew (/proc/meminfo Cached) by the end, i.e. the RAM the tier would take back.

Run: .venv/bin/python benchmarks/disk_tier.py [--dir /path/on/nvme] [--unit-MiB 64] [--units 16] [--rounds 3]

Measured here (2026-11-25, a 2-core VM's virtual disk, ext4, 16 x 64 MiB, 3 rounds): see the
issue note; the executor's default is 'direct'.
"""
import argparse
import json
import os
import statistics as st
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("direct", "buffered", "mmap")


def _child(method: str, folder: str, unit: int, units: int) -> dict:
    import mmap

    import torch

    from horizon_exec.procfs import meminfo_bytes, rss_bytes
    from horizon_exec.runtime.disk_store import DiskStore
    cached0, rss0 = meminfo_bytes("Cached") or 0, rss_bytes()
    d = DiskStore({f"u{i}": unit for i in range(units)}, folder, method)
    stage = torch.frombuffer(mmap.mmap(-1, unit), dtype=torch.uint8)
    stage.fill_(3)
    t0 = time.perf_counter()
    for i in range(units):
        d.write(f"u{i}", stage)
    t1 = time.perf_counter()
    for i in range(units):
        d.read(f"u{i}", stage)
    t2 = time.perf_counter()
    out = {"write_GBps": unit * units / (t1 - t0) / 1e9, "read_GBps": unit * units / (t2 - t1) / 1e9,
           "rss_growth_MiB": (rss_bytes() - rss0 - unit) / 2**20,
           "cache_growth_MiB": ((meminfo_bytes("Cached") or 0) - cached0) / 2**20, "method": d.method}
    d.close()
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="folder on the disk to measure (default: temp dir)")
    ap.add_argument("--unit-MiB", type=int, default=64, help="bytes per unit (default 64 MiB)")
    ap.add_argument("--units", type=int, default=16, help="units per pass (default 16)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not os.path.isdir(a.dir) or a.unit_MiB <= 0 or a.units <= 0 or a.rounds <= 0:
        print(f"--dir {a.dir!r} must be a folder; --unit-MiB, --units, --rounds positive", file=sys.stderr)
        return 2
    from horizon_exec.measure.child import child_env
    res = {m: [] for m in METHODS}
    for _ in range(a.rounds):
        for m in METHODS:
            r = subprocess.run([sys.executable, __file__, "--child", m, a.dir, str(a.unit_MiB << 20), str(a.units)],
                               capture_output=True, text=True, cwd=ROOT, env=child_env({}), timeout=900)
            if r.returncode != 0:
                print(f"{m}: failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            res[m].append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"disk tier I/O in {a.dir}: {a.units} units of {a.unit_MiB} MiB written then read, median of {a.rounds} "
          "alternated rounds, one process per method")
    print(f"  {'method':<10}{'write GB/s':>11}{'read GB/s':>11}{'RSS grew':>11}{'page cache grew':>17}")
    for m, rows in res.items():
        med = {k: st.median(r[k] for r in rows) for k in ("write_GBps", "read_GBps", "rss_growth_MiB",
                                                           "cache_growth_MiB")}
        used = rows[-1]["method"] + ("" if rows[-1]["method"] == m else f" (asked {m})")
        print(f"  {used:<10}{med['write_GBps']:>11.2f}{med['read_GBps']:>11.2f}{med['rss_growth_MiB']:>8.0f} MiB"
              f"{med['cache_growth_MiB']:>13.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
