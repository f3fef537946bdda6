"""Issue 19, item 1: a closed stdout must not decide whether training runs. `horizon train |
head -1` goes on to the last step, writes its checkpoint and log, says once on stderr that its
output is dropped, and exits with the run's own status."""
import json

from tests.train_run import env, popen


def test_training_outlives_a_reader_that_left(tmp_path):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    # unbuffered, so that the reader has gone before the run writes its next line (as in a long run)
    proc = popen("--steps", "6", "--ckpt-dir", ckpt, "--ckpt-interval", "2", "--log-file", log,
                 env=env(PYTHONUNBUFFERED="1"))
    first = proc.stdout.readline()
    proc.stdout.close()                      # the reader leaves, as `head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert first.startswith("device cpu: ")   # the first line: which device and why (cli/default_device.py)
    assert (ckpt / "latest").read_text().strip() == "step-00000006"      # the run went to its end
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert "stdout failed (the reader closed it); carrying on, its output is dropped" in err
    assert "Traceback" not in err and err.count("stdout failed") == 1


def test_a_stdout_file_on_a_full_disk_does_not_stop_training(tmp_path):
    """/dev/full: every write fails with ENOSPC, as a redirect to a full disk does."""
    ckpt = tmp_path / "ckpt"
    with open("/dev/full", "w") as full:
        proc = popen("--steps", "3", "--ckpt-dir", ckpt, stdout=full)
        err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 0, err
    assert "stdout failed (No space left on device); carrying on" in err and "Traceback" not in err
    assert (ckpt / "latest").read_text().strip() == "step-00000003"


def test_a_closed_stdout_does_not_stop_training(tmp_path, monkeypatch):
    """Issue 30: `horizon train >&-` (fd 1 closed at start: Python's sys.stdout is None) was an
    AttributeError, exit 120, and no checkpoint. In-process (a training subprocess costs 5-15 s
    here); the descriptors themselves: the next test."""
    import sys

    from horizon_sim.cli.main import main
    from tests.train_run import TINY
    monkeypatch.setattr(sys, "stdout", None)
    ckpt = tmp_path / "ckpt"
    assert main(["train", *TINY, "--steps", "1", "--compute-dtype", "fp32", "--no-working-copy",
                 "--ckpt-dir", str(ckpt)]) == 0
    assert (ckpt / "latest").read_text().strip() == "step-00000001"


CLOSED_FDS = """
import os, sys
from horizon_sim.cli.stdout_guard import reopen_closed_std_fds
assert sys.stdout is None and sys.stdin is None
reopen_closed_std_fds()
print("dropped")                      # into /dev/null, no AttributeError
f = open(os.devnull)                  # a file opened later does not take a standard descriptor
sys.stderr.write(f"ok {f.fileno() > 2}")
"""


def test_closed_standard_descriptors_are_reopened_on_dev_null():
    import os
    import subprocess
    import sys

    from tests.train_run import ROOT
    r = subprocess.run([sys.executable, "-c", CLOSED_FDS], cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=60, preexec_fn=lambda: (os.close(0), os.close(1)))
    assert (r.returncode, r.stderr) == (0, "ok True")


class _GoneReader:
    """A stderr whose reader left (`2>&1 >/dev/null | head -c 10`): every write is EPIPE."""
    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        raise OSError("no descriptor")

    def isatty(self):
        return False


def test_the_progress_bar_on_a_stderr_whose_reader_left_does_not_stop_training(tmp_path, monkeypatch):
    """Issue 30: the progress bar's first redraw on a closed stderr pipe ended the run, exit 1,
    no checkpoint; it goes on, output dropped."""
    import sys

    from horizon_sim.cli.main import main
    from tests.train_run import TINY
    monkeypatch.setattr(sys, "stderr", _GoneReader())
    argv = ["train", *[a for a in TINY if a != "--no-progress"], "--steps", "2", "--compute-dtype", "fp32",
            "--no-working-copy", "--ckpt-dir", str(tmp_path / "ck")]
    assert main(argv) == 0
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step-00000002"
