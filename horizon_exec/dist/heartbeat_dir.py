"""The launcher's heartbeat folder (watchdog.py: each rank touches rank-R in it): made private,
trusted only when it is, and not left behind by a launcher that was killed.

The launcher removes its folder when it ends; killed outright (SIGKILL, the OOM killer) it cannot,
and its ranks die with it by SIGKILL (PR_SET_PDEATHSIG), so nothing did: every killed launch left a
horizon-heartbeat-* folder in the temp dir (issue 43). The folder's name therefore records its
launcher (pid and the kernel's start time of that process, so a pid the system has since reused
does not keep a dead launcher's folder alive) and every launch first removes the folders of
launchers that are gone: only plain folders (no symbolic links) of this user, in the temp dir.
"""
import os
import re
import shutil
import stat
import tempfile

PREFIX = "horizon-heartbeat-"
_NAME = re.compile(re.escape(PREFIX) + r"([0-9]+)-([0-9]+)-[A-Za-z0-9_]+")


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22); None: no
    such process, or no /proc to read it from."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, start: int) -> bool:
    """The launcher that made a folder still runs: its pid is there with the same start time
    (without /proc, or a start its launcher could not read, recorded as 0: the pid is there)."""
    if start and os.path.isdir("/proc/self"):
        return _start_ticks(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: there, so it may be ours under a reused pid; keep it
        return True
    return True


def make() -> str:
    """A new private folder (mode 0700, mkdtemp) for this launcher, named after it (module docstring)."""
    me = os.getpid()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{me}-{_start_ticks(me) or 0}-")


def sweep_stale(tmp: str | None = None) -> list[str]:
    """Remove the heartbeat folders of launchers that are gone; the paths removed."""
    tmp = tmp or tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return []
    gone = []
    for n in names:
        m = _NAME.fullmatch(n)
        if m is None:
            continue
        path = os.path.join(tmp, n)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():  # a link, a file, someone else's
            continue
        if _alive(int(m[1]), int(m[2])):
            continue
        shutil.rmtree(path, ignore_errors=True)  # (its entries are unlinked, never followed)
        if not os.path.lexists(path):
            gone.append(path)
    return gone


def trusted(folder: str) -> bool:
    """A heartbeat folder a rank may write in: a real folder (not a link) of this user that no
    one else may write to (an environment variable names it: it is checked, not believed)."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
