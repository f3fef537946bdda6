"""A rank outlives its launcher by at most about POLL_S.

The launcher (torch.distributed.run inside `horizon train`) stops its ranks when it is asked to
stop; killed outright (SIGKILL, the OOM killer) it cannot, and its ranks went on training with
each other as orphans (about 190 of them for 40 minutes, past --dist-timeout: their peers were
alive, so no collective ever timed out). Each rank therefore watches its parent:
- PR_SET_PDEATHSIG (Linux): the kernel sends the rank SIGKILL when the launcher dies, even
  while the rank sits in native code holding the GIL;
- a daemon thread polls getppid() every POLL_S where prctl is unavailable (or the signal was
  missed: a launcher that died before the prctl call), and ends the process with one line.
The same thread is the rank's heartbeat: it touches HEARTBEAT_ENV's folder/rank-R every POLL_S.
A rank that is stopped (SIGSTOP, a debugger, a swapped-out machine) stops beating, so when a
peer then fails waiting for it the launcher names the stalled rank rather than the one that
gave up first (stalled_ranks, used by launch.py).
"""
import ctypes
import os
import signal
import sys
import threading

POLL_S = 0.2
"""How often the thread checks that the launcher is still this process's parent."""
HEARTBEAT_ENV = "HORIZON_HEARTBEAT_DIR"
STALL_S = 3.0
"""A rank whose last heartbeat is this much older than the failed rank's was stalled (many
missed beats: a busy machine delays a beat by a poll or two, not by seconds)."""
_PR_SET_PDEATHSIG = 1


def _set_pdeathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def start(launcher_pid: int | None = None, poll_s: float = POLL_S,
          pdeathsig: bool = True) -> threading.Thread | None:
    """Watch the launcher (default: this process's parent now); the rank exits 1 soon after it dies.
    None when there is no launcher to watch (parent already init: nothing would tell us).
    pdeathsig False: the polling thread alone, without PR_SET_PDEATHSIG (what a platform without
    prctl gets; a test process that must not be killed with its parent)."""
    parent = os.getppid() if launcher_pid is None else launcher_pid
    if parent <= 1:
        return None
    if pdeathsig and sys.platform.startswith("linux"):
        _set_pdeathsig(signal.SIGKILL)
    stop = threading.Event()
    beat = _heartbeat_file()

    def watch():
        while not stop.wait(poll_s):
            if beat is not None:
                try:
                    os.utime(beat)
                except OSError:
                    pass
            if os.getppid() != parent:
                try:
                    os.write(2, f"horizon train: rank {os.environ.get('RANK', '?')}: the launcher (pid {parent}) "
                                f"is gone; exiting\n".encode())
                except OSError:
                    pass
                os._exit(1)
    t = threading.Thread(target=watch, name="horizon-launcher-watchdog", daemon=True)
    t.stop = stop
    t.start()
    if os.getppid() != parent:  # it died before the prctl took effect
        os._exit(1)
    return t


def _heartbeat_file() -> str | None:
    """rank-R in the launcher's heartbeat folder, made; None (no heartbeat) when there is none or
    the folder is not private to this user (heartbeat_dir.trusted: not written through a link)."""
    from horizon_exec.dist.heartbeat_dir import trusted
    folder, rank = os.environ.get(HEARTBEAT_ENV), os.environ.get("RANK")
    if not folder or rank is None or not rank.isdigit() or not trusted(folder):
        return None
    path = os.path.join(folder, f"rank-{rank}")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    except OSError:
        return None
    return path


def last_beats(folder: str) -> dict[int, float]:
    """rank -> time of its last heartbeat, for the ranks of this node that beat in `folder`."""
    out = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for n in names:
        if n.startswith("rank-") and n[5:].isdigit():
            try:
                out[int(n[5:])] = os.stat(os.path.join(folder, n)).st_mtime
            except OSError:
                pass
    return out


def stalled_ranks(beats: dict[int, float], failed: int, stall_s: float = STALL_S) -> list[int]:
    """Ranks whose heartbeat stopped well before the failed rank's did (module docstring)."""
    ref = beats.get(failed)
    if ref is None:
        return []
    return sorted(r for r, t in beats.items() if r != failed and t < ref - stall_s)
