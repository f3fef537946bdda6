"""Benchmark: the disk tier's ways of moving a unit's moments between RAM and the file
(runtime/disk_store.py: O_DIRECT, buffered pread/pwrite, mmap), side by side on this machine's
disk, and what each leaves resident in RAM (issue 18's "direct I/O or memory mapping: measure
which is faster here and say why").

Each method runs in a process of its own: `--units` units of `--unit-MiB` are written and read
back whole, `--rounds` times, alternating the methods; rates are the median over rounds of bytes
/ time. Beside the rates: how much the process's peak RSS grew beyond the stage (the RAM a way takes
back from the tier: mmap keeps every touched page resident). The measurement is calibrate's
(horizon_exec/measure/calibrate/disk.py). A virtual machine's disk may be served from the
hypervisor's cache, so buffered reads can look faster than the device is.

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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("direct", "buffered", "mmap")


def _child(method: str, folder: str, unit: int, units: int) -> dict:
    """calibrate's own measurement (one round), with the peak RSS around it."""
    import resource

    from horizon_exec.measure.calibrate.disk import measure_disk
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # noqa: E731 (Linux: KiB)
    peak0 = peak()
    r = measure_disk(folder, unit_bytes=unit, units=units, rounds=1, method=method)
    return {**r, "rss_growth_MiB": (peak() - peak0 - unit) / 2**20}  # less the stage itself


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
    print(f"  {'method':<10}{'write GB/s':>11}{'read GB/s':>11}{'peak RSS grew':>15}")
    for m, rows in res.items():
        med = {k: st.median(r[k] for r in rows) for k in ("write_GBps", "read_GBps", "rss_growth_MiB")}
        used = rows[-1]["method"] + ("" if rows[-1]["method"] == m else f" (asked {m})")
        print(f"  {used:<10}{med['write_GBps']:>11.2f}{med['read_GBps']:>11.2f}{med['rss_growth_MiB']:>11.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
