"""Issue 43, item 8e: the launcher's heartbeat folder (dist/heartbeat_dir.py). A launcher killed
outright (SIGKILL) left its horizon-heartbeat-* folder in the temp dir; the next launch removes the
folders of launchers that are gone (only this user's plain folders), and a rank beats only in a
folder private to this user. No rank starts here: torch.distributed.run is replaced."""
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from horizon_exec.dist import launch, watchdog
from tests.train_run import ROOT, env

# A launcher whose ranks are never started: it stops inside torch.distributed.run, its heartbeat
# folder made, until it is killed.
LAUNCHER = """
import sys, time
import torch.distributed.run as tdr
from horizon_exec.dist import launch
def run(args):
    print("up", flush=True)
    time.sleep(120)
tdr.run = run
launch.launch(launch.LaunchConfig(nproc_per_node=2, master_port=int(sys.argv[1])), "{}")
"""


def _folders(tmp) -> list[str]:
    return sorted(n for n in os.listdir(tmp) if n.startswith("horizon-heartbeat-"))


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """tmp_path is this process's temp dir; what the launcher sets in the environment is put back."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for k in (launch.ARGS_ENV, watchdog.HEARTBEAT_ENV):
        monkeypatch.setenv(k, "")
    return tmp_path


def _launch_here() -> None:
    """One launch in this process whose ranks all end at once (exit 0)."""
    import torch.distributed.run as tdr
    from unittest import mock
    with mock.patch.object(tdr, "run", lambda args: None), \
            mock.patch("horizon_exec.dist.rendezvous.check_rendezvous", lambda *a: None), \
            mock.patch("horizon_exec.dist.rendezvous.quiet_cpp_logs", lambda: None):
        assert launch.launch(launch.LaunchConfig(nproc_per_node=2), "{}") == 0


def test_a_killed_launchers_folder_is_removed_by_the_next_launch(own_tmp):
    from tests.test_dist_rank_killed import _free_port
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(_free_port())], cwd=ROOT,
                         env=env(TMPDIR=str(own_tmp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up\n", p.stderr.read()[-2000:]
        left = _folders(own_tmp)
        assert len(left) == 1   # the killed launcher's, as it was
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert _folders(own_tmp) == left   # nothing removed it
    _launch_here()
    assert _folders(own_tmp) == []    # the next launch removed it, and its own when it ended


def test_the_sweep_removes_only_the_folders_of_gone_launchers(own_tmp):
    from horizon_exec.dist import heartbeat_dir
    me, start = os.getpid(), heartbeat_dir._start_ticks(os.getpid())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = own_tmp / f"{heartbeat_dir.PREFIX}{dead.pid}-1-a1"       # its launcher exited
    (gone / "sub").mkdir(parents=True)
    (gone / "rank-0").touch()
    reused = own_tmp / f"{heartbeat_dir.PREFIX}{me}-{start + 1}-b2"  # this pid, another process's start
    reused.mkdir()
    live = own_tmp / f"{heartbeat_dir.PREFIX}{me}-{start}-c3"        # this process's: running
    live.mkdir()
    target = own_tmp / "precious"
    target.mkdir()
    (target / "keep").touch()
    link = own_tmp / f"{heartbeat_dir.PREFIX}{dead.pid}-1-d4"       # a link is never followed or removed
    link.symlink_to(target)
    plain = own_tmp / f"{heartbeat_dir.PREFIX}{dead.pid}-1-e5"      # a file is not a heartbeat folder
    plain.touch()
    foreign = own_tmp / f"{heartbeat_dir.PREFIX}{dead.pid}-1-f6"   # another user's: theirs to remove
    foreign.mkdir()
    if os.getuid() == 0:
        os.chown(foreign, 54321, 54321)
    assert sorted(heartbeat_dir.sweep_stale()) == sorted([str(gone), str(reused)] + ([] if os.getuid() == 0 else
                                                                                     [str(foreign)]))
    assert live.is_dir() and link.is_symlink() and (target / "keep").exists() and plain.exists()
    assert foreign.is_dir() or os.getuid() != 0


def test_a_launch_folder_is_private_and_named_after_its_launcher(own_tmp):
    from horizon_exec.dist import heartbeat_dir
    d = heartbeat_dir.make()
    try:
        assert os.stat(d).st_mode & 0o777 == 0o700
        assert os.path.basename(d).startswith(f"{heartbeat_dir.PREFIX}{os.getpid()}-")
        assert heartbeat_dir.sweep_stale() == []   # its launcher (this process) is running
    finally:
        os.rmdir(d)


@pytest.mark.parametrize("kind", ["shared", "link"])
def test_a_rank_does_not_beat_in_a_folder_others_can_write(tmp_path, monkeypatch, kind):
    folder = tmp_path / "beats"
    if kind == "shared":
        folder.mkdir(mode=0o777)
        os.chmod(folder, 0o777)   # (the umask)
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv(watchdog.HEARTBEAT_ENV, str(folder))
    monkeypatch.setenv("RANK", "0")
    assert watchdog._heartbeat_file() is None
    assert not (tmp_path / "elsewhere" / "rank-0").exists() and not (folder / "rank-0").exists()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv(watchdog.HEARTBEAT_ENV, str(private))
    assert watchdog._heartbeat_file() == str(private / "rank-0")
    if os.getuid() == 0:  # a private folder of another user's is not this rank's either
        os.unlink(private / "rank-0")
        os.chown(private, 54321, 54321)
        assert watchdog._heartbeat_file() is None and not (private / "rank-0").exists()
