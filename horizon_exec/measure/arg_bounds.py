"""The bounds of `horizon calibrate` and `horizon validate`'s arguments, checked before anything
is measured: a mistyped `--rounds 1000000` or `--peer-threads 100000` would otherwise run for
days, and a missing `--disk-dir` was refused only after 11 s of measuring the rest.

Each bound is far above what a real run asks for and low enough that the worst accepted value
finishes in hours, not years."""
import os
from pathlib import Path

from horizon_sim.errors import HorizonError

ROUNDS = (1, 100)
"""calibrate --rounds: each round repeats the noise-prone measurements (~10 s on 2 cores)."""
STEPS_MAX = 1000
"""validate --steps: measured steps per configuration (the default is 6)."""
WARMUP_MAX = 100
"""validate --warmup: unmeasured steps before them (the default is 1)."""


def _in(flag: str, v: int, lo: int, hi: int, why: str = "") -> None:
    if v < lo:
        raise HorizonError(f"{flag} {v} must be >= {lo}")
    if v > hi:
        raise HorizonError(f"{flag} {v} must be <= {hi}{why}")


def check_disk_dir(d) -> None:
    """--disk-dir: an existing folder (a file is 'not a folder', not 'missing')."""
    if d is None:
        return
    p = Path(d)
    if not p.exists():
        raise HorizonError(f"--disk-dir {str(d)!r} does not exist; give an existing folder on the disk to measure")
    if not p.is_dir():
        raise HorizonError(f"--disk-dir {str(d)!r} is not a folder; give a folder on the disk to measure")


def check_calibrate(a) -> None:
    if a.rounds is not None:
        _in("--rounds", a.rounds, *ROUNDS)
    for flag, v in (("--batch", a.batch), ("--seq", a.seq), ("--micro-batches", a.micro_batches)):
        if v < 1:
            raise HorizonError(f"{flag} {v} must be >= 1")
    check_disk_dir(a.disk_dir)


def check_validate(a) -> None:
    _in("--steps", a.steps, 1, STEPS_MAX)
    _in("--warmup", a.warmup, 0, WARMUP_MAX)
    if a.peer:  # more torch threads than cores only make the peer's step time noise
        cores = os.cpu_count() or 1
        _in("--peer-threads", a.peer_threads, 1, cores, f" (this machine's {cores} CPUs)")
    if a.configs is not None and not [n for n in a.configs.split(",") if n.strip()]:
        raise HorizonError(f"--configs {a.configs!r} names no configuration; give comma-separated names, "
                           "or leave --configs out to run them all")
