"""`horizon train` as a subprocess, for the hardening tests (issue 19): a micro model (one layer,
hidden 64, byte vocabulary: micro_model.json; its checkpoint is ~1 MB) on the built-in corpus,
no progress bar."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "tests" / "micro_model.json"
TINY = ["--model", str(MICRO), "--batch", "2", "--seq", "32", "--no-progress", "--eval-batches", "0"]


def train_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "horizon_sim.cli.main", "train", *TINY, *map(str, args)]


def env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def train(*args, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run `horizon train` (tiny) to completion; stdout and stderr captured as text."""
    return subprocess.run(train_cmd(*args), cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=timeout, **kw)


def popen(*args, **kw) -> subprocess.Popen:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("env", env())
    return subprocess.Popen(train_cmd(*args), cwd=ROOT, text=True, **kw)


def tmpfs_works() -> bool:
    """Whether this machine lets a process mount a private tmpfs (root, or user namespaces)."""
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def in_tmpfs(script: str, size: str = "1m", read_only: bool = False, setup: str = "",
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the shell `script` with a fresh tmpfs of `size` mounted at $M (private to it: a
    mount namespace), after `setup` ran there; read_only: remounted read-only before `script`.
    $TRAIN is `horizon train` on the micro model (train_cmd()), $PY this Python."""
    train = " ".join(shlex.quote(a) for a in train_cmd())
    ro = 'mount -o remount,ro "$M" && ' if read_only else ""
    body = f'M=/mnt; PY={shlex.quote(sys.executable)}; TRAIN="{train}"; mount -t tmpfs -o size={size} tmpfs "$M" && {setup or ":"} && {ro}{script}'
    return subprocess.run(["unshare", "-rm", "sh", "-c", body], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=timeout)
