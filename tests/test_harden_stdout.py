"""Issue 19, item 1: a closed stdout must not decide whether training runs. `horizon train |
head -1` goes on to the last step, writes its checkpoint and log, says once on stderr that its
output is dropped, and exits with the run's own status."""
import json

from tests.harden_run import env, popen


def test_training_outlives_a_reader_that_left(tmp_path):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    # unbuffered, so that the reader has gone before the run writes its next line (as in a long run)
    proc = popen("--steps", "6", "--ckpt-dir", ckpt, "--ckpt-interval", "2", "--log-file", log,
                 env=env(PYTHONUNBUFFERED="1"))
    first = proc.stdout.readline()
    proc.stdout.close()                      # the reader leaves, as `head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert first.startswith("horizon train: ")
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
