"""`horizon train` as a subprocess, for the hardening tests (issue 19): the tiny model on the
built-in corpus, a few steps, no progress bar."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny", "--batch", "2", "--seq", "32", "--no-progress", "--eval-batches", "0"]


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
    return subprocess.Popen(train_cmd(*args), cwd=ROOT, env=env(), text=True, **kw)
