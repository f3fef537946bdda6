"""What Linux's /proc says about this machine and process, read in one place (the admission,
calibration, the probe, the file writer and the native kernel's build key all ask). Every
reader answers None (or a stated fallback) where /proc is missing instead of failing.
Torch-free."""
import os
import sys

from horizon_sim.safe_files import umask  # noqa: F401 - procfs is where the executor looks for it


def _lines(path: str):
    try:
        with open(path) as f:
            yield from f
    except OSError:
        return


def _field(path: str, name: str) -> str | None:
    """The text after 'name:' on the first line of `path` that starts with it."""
    for line in _lines(path):
        if line.startswith(name + ":") or (line.startswith(name) and line[len(name):].lstrip().startswith(":")):
            return line.split(":", 1)[1].strip()
    return None


def meminfo_bytes(field: str) -> int | None:
    """A field of /proc/meminfo ('MemTotal', 'MemAvailable', ...) in bytes, else None."""
    v = _field("/proc/meminfo", field)
    try:
        return int(v.split()[0]) * 1024 if v else None
    except (ValueError, IndexError):
        return None


def mem_available_bytes() -> int | None:
    """MemAvailable (RAM the kernel can give without swapping), else None."""
    return meminfo_bytes("MemAvailable")


def _statm_bytes(column: int) -> int:
    """/proc/self/statm's `column` (0: address space, 1: resident) in bytes; 0 where /proc is
    not available."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[column]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def rss_bytes() -> int:
    """This process's resident set size now (0 where /proc is not available)."""
    return _statm_bytes(1)


def vm_size_bytes() -> int:
    """This process's address space now (VmSize; 0 where /proc is not available)."""
    return _statm_bytes(0)


def address_space_limit_bytes() -> int | None:
    """The soft RLIMIT_AS (`ulimit -v`) in bytes, or None when unlimited."""
    import resource
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def vm_hwm_bytes() -> int:
    """This process's peak resident set (VmHWM). Unlike ru_maxrss, which a child started by
    fork/vfork + exec inherits from its parent's RSS at that moment, VmHWM belongs to the
    child's own address space: a probe started from a large process still measures itself.
    Falls back to ru_maxrss where /proc is missing."""
    v = _field("/proc/self/status", "VmHWM")
    try:
        return int(v.split()[0]) * 1024
    except (AttributeError, ValueError, IndexError):
        import resource
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(r if sys.platform == "darwin" else r * 1024)


def rss_shmem_bytes() -> int:
    """Resident pages of this process that are shared memory (RssShmem: a /dev/shm mapping such
    as data parallel's node store, which every local rank maps and each counts in its RSS);
    0 where /proc is missing."""
    v = _field("/proc/self/status", "RssShmem")
    try:
        return int(v.split()[0]) * 1024 if v else 0
    except (ValueError, IndexError):
        return 0


def node_rss_bytes(peaks: list[int], shmem: list[int]) -> int:
    """The memory a node's local ranks hold together, from each rank's peak RSS and its resident
    shared memory: every rank's private peak, plus the shared store once (the largest mapping
    any rank has touched: the leader, which initialised it, touched all of it)."""
    return int(sum(p - s for p, s in zip(peaks, shmem)) + max(shmem, default=0))


def cpu_flags() -> str:
    """The CPU's feature line of /proc/cpuinfo ('flags' on x86, 'Features' on Arm), else the
    platform's processor name: part of the native kernel's build key."""
    for line in _lines("/proc/cpuinfo"):
        if line.startswith(("flags", "Features")):
            return line
    import platform
    return platform.processor()


def cpu_name() -> str:
    """The CPU's model name, else the platform's processor name, else 'cpu'."""
    v = _field("/proc/cpuinfo", "model name")
    if v:
        return v
    import platform
    return platform.processor() or "cpu"
