"""The per-user cache of this machine's descriptions: $HORIZON_CACHE_DIR/machines, else
$XDG_CACHE_HOME/horizon/machines, else ~/.cache/horizon/machines (an empty or relative
XDG_CACHE_HOME is ignored, as the XDG spec says; the native kernel's cache follows the same
rule). One file per machine key (detect.machine_key): <key>.toml is what `horizon calibrate`
measured, <key>.estimate.toml the quick estimate (kept ESTIMATE_LIFE_S). Both are hardware
TOML files (`horizon plan --hardware` reads them) whose first comment line holds the key.

The folder must be private (private_dir.py: yours, not writable by others, nor any folder above
it but sticky ones) and a file in it is read only when it is a regular file of yours that no one
else can write: a description someone else could plant would set what the planner admits. A
folder or file that fails is not used (why_unusable says why, for the one line the caller prints).
"""
import os
import time
from pathlib import Path

from horizon_exec.private_dir import NotPrivate, file_problem, make_private_dir
from horizon_exec.measure.machine.detect import key_name

ESTIMATE_LIFE_S = 24 * 3600
"""How long a quick estimate is reused: `horizon train` runs are often seconds apart and each
estimate costs seconds; a machine of the same key keeps its speeds, while the load it was
measured under passes. `horizon calibrate` replaces it for good."""


def cache_dir() -> Path:
    """The configured folder (not yet checked: private_cache_dir does that)."""
    from horizon_exec.private_dir import horizon_cache_dir
    return horizon_cache_dir("machines")


def private_cache_dir() -> Path:
    """cache_dir(), created 0700 where missing, once it is private; NotPrivate or OSError if not."""
    return make_private_dir(cache_dir())


def calibration_path(key: dict) -> Path:
    return cache_dir() / f"{key_name(key)}.toml"


def estimate_path(key: dict) -> Path:
    return cache_dir() / f"{key_name(key)}.estimate.toml"


def why_unusable(path: Path) -> str:
    """'' when `path` may be read (a private folder, a file of yours no one else can write),
    else why not; a missing file is 'absent'."""
    try:
        private_cache_dir()
    except NotPrivate as e:
        return f"the cache folder {cache_dir()} is not private ({e})"
    except OSError as e:
        return f"the cache folder {cache_dir()} cannot be made ({e.strerror})"
    why = file_problem(path)
    if why:
        return why
    return "" if path.exists() else "absent"


def write(path: Path, text: str) -> Path:
    """Write `text` to `path` in the private cache folder, atomically (a reader sees the old
    file or the new one), mode 0600; NotPrivate or OSError when it cannot."""
    folder = private_cache_dir()
    target = folder / path.name
    tmp = folder / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def age_s(path: Path) -> float:
    return time.time() - path.stat().st_mtime


def shown(path: Path) -> str:
    """`path` with the home folder as ~ (the line a user reads)."""
    home = str(Path.home())
    s = str(path)
    return "~" + s[len(home):] if home not in ("", "/") and s.startswith(home + os.sep) else s
