"""Issue 30: plots, Chrome traces and report text are written to a temporary file beside the
target and renamed over it (horizon_sim/safe_files.write_atomic). On a full disk the run says so
in one line and leaves no truncated PNG that looks like a plot (nor a temporary file); a plot
written before stays whole."""
import os

import pytest

from horizon_sim.errors import HorizonError


@pytest.mark.parametrize("what", ["plot", "trace"])
def test_simulate_outputs_on_a_full_disk_leave_nothing_truncated(tmp_path, what):
    """The disk fills mid-write (a file size limit, which fails a write as a full disk does):
    one line, and no truncated step.png / step.json left behind."""
    import resource

    from horizon_sim.plan import plan
    from horizon_sim.specs.policy import Policy
    from horizon_sim.specs.hardware_presets import make_hardware
    r = plan("tiny", make_hardware("h100-pcie"), Policy(batch=1, seq=64))
    out = tmp_path / ("step.png" if what == "plot" else "step.json")
    if what == "plot":
        from horizon_sim.report.gantt import plot_overlap as write
    else:
        from horizon_sim.report.trace import write_trace as write
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # Python ignores SIGXFSZ: writes fail EFBIG
    try:
        with pytest.raises(HorizonError) as e:
            write(r, out)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    msg = str(e.value)
    assert f"cannot write {what}" in msg and str(out) in msg and "\n" not in msg, msg
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # was: a 4096-byte truncated file


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from horizon_sim import safe_files
    target = tmp_path / "t.json"
    target.write_text("OLD")

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safe_files.os, "fsync", full)
    with pytest.raises(HorizonError, match=r"cannot write trace .*t.json'.*No space left on device"):
        safe_files.write_atomic(target, b"NEW" * 1000, "trace")
    assert target.read_text() == "OLD" and os.listdir(tmp_path) == ["t.json"]


def test_write_atomic_replaces_and_writes_devices_in_place(tmp_path):
    from horizon_sim.safe_files import write_atomic
    write_atomic(tmp_path / "a.png", b"one", "plot")
    write_atomic(tmp_path / "a.png", b"two", "plot")
    assert (tmp_path / "a.png").read_bytes() == b"two" and os.listdir(tmp_path) == ["a.png"]
    write_atomic("/dev/null", b"x", "plot")  # a character device: written in place, never renamed over
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_a_written_file_has_the_ordinary_mode_not_mkstemps(tmp_path):
    """The temporary file mkstemp makes is 0600; a report, plot or trace is published as any
    file the user writes: 0666 & ~umask (the train report's files were 0600)."""
    import os

    from horizon_sim.safe_files import write_atomic
    old = os.umask(0o027)
    try:
        p = write_atomic(tmp_path / "r.md", b"x\n", "report")
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o640
