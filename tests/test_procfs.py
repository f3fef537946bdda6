"""/proc readers (horizon_exec/procfs.py): what they read agrees with the kernel's other views,
and each has its stated answer where /proc is missing instead of failing."""
import builtins
import os
import resource

from horizon_exec import procfs


def test_readings_agree_with_other_views():
    total = procfs.meminfo_bytes("MemTotal")
    assert total == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") or abs(total / (
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) - 1) < 0.01
    assert 0 < procfs.mem_available_bytes() <= total
    assert procfs.meminfo_bytes("NoSuchField") is None
    assert 0 < procfs.rss_bytes() <= procfs.vm_hwm_bytes()
    assert procfs.vm_hwm_bytes() <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 * 1.01
    mask = os.umask(0o027)
    try:
        assert procfs.umask() == 0o027
    finally:
        os.umask(mask)
    assert procfs.cpu_name() and procfs.cpu_flags()


def test_without_proc_each_reader_falls_back(monkeypatch):
    real = builtins.open

    def no_proc(path, *a, **k):
        if str(path).startswith("/proc"):
            raise FileNotFoundError(path)
        return real(path, *a, **k)

    monkeypatch.setattr(builtins, "open", no_proc)
    assert procfs.meminfo_bytes("MemTotal") is None and procfs.mem_available_bytes() is None
    assert procfs.rss_bytes() == 0
    assert procfs.vm_hwm_bytes() > 0                      # ru_maxrss
    mask = os.umask(0)
    os.umask(mask)
    assert procfs.umask() == mask                         # read by setting and restoring it
    assert os.umask(mask) == mask                         # and left as it was
    assert isinstance(procfs.cpu_name(), str) and procfs.cpu_name()
