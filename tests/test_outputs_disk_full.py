"""Issue 19, item 5: a full disk (ENOSPC), a file size limit (`ulimit -f`: SIGXFSZ is ignored by
Python, so EFBIG) or a read-only file system met while training writes is one line naming the
path and what it needed; checkpoints stay atomic (the previous one intact, nothing half-written
left behind); a metrics log that cannot be written stops the run the same way (issue 30)."""
import os
import re
import resource
import subprocess

import pytest

from horizon_exec.checkpoints import ckpt as ckpt_mod
from tests.train_run import ROOT, env, in_tmpfs, tmpfs_works, train_cmd

needs_tmpfs = pytest.mark.skipif(not tmpfs_works(), reason="needs a private tmpfs mount (root or user namespaces)")
# After the run, still inside the mount namespace: what the checkpoint folder holds, and whether
# every complete checkpoint in it verifies.
INSPECT = ('; echo "rc=$?"; ls -A "$M" "$M/ck"; $PY -c "import sys; from horizon_exec.checkpoints import ckpt; '
           '[ckpt.verify_checkpoint(p) for p in ckpt.list_checkpoints(sys.argv[1])]; print(\'verified\')" "$M/ck"')


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("horizon train: error:")]
    assert len(lines) == 1, err
    return lines[0]


@needs_tmpfs
def test_disk_full_at_a_checkpoint_keeps_the_previous_one():
    """1500 KiB (the up-front check skipped, as if the disk filled during the run): the first
    checkpoint (~970 KiB) fits, the second does not."""
    r = in_tmpfs('$TRAIN --steps 3 --ckpt-dir "$M/ck" --ckpt-interval 1 --no-admission' + INSPECT, size="1500k")
    assert "rc=1" in r.stdout, (r.stdout, r.stderr)
    line = _one_error_line(r.stderr)
    assert re.search(r"cannot write checkpoint /mnt/ck/step-00000002: no space left on the device; it needs about "
                     r"[\d.]+ [KM]iB \([\d.]+ [KM]?i?B free there\); the checkpoints before it are intact$", line), line
    listing = r.stdout.split("rc=1")[1].split()
    assert [n for n in listing if not n.startswith("/mnt")] == ["ck", ".lock", "latest", "step-00000001", "verified"]


@needs_tmpfs
def test_disk_full_at_save_hf_says_where_the_weights_are():
    """1050 KiB: the last checkpoint fits (the up-front check skipped), the HF save does not
    (bf16 compute: the sizes this was set for; fp32's pending gradients are twice as large)."""
    r = in_tmpfs('$TRAIN --steps 2 --ckpt-dir "$M/ck" --save-hf "$M/out" --no-admission --compute-dtype bf16'
                 + INSPECT, size="1050k")
    assert "rc=1" in r.stdout and "final loss" in r.stdout, (r.stdout, r.stderr)
    line = _one_error_line(r.stderr)
    assert "--save-hf: cannot write the HF checkpoint /mnt/out: no space left on the device" in line, line
    assert re.search(r"it needs about [\d.]+ KiB", line) and line.endswith(
        "the trained weights are in the checkpoint /mnt/ck/step-00000002"), line
    listing = r.stdout.split("rc=1")[1].split()
    assert [n for n in listing if not n.startswith("/mnt")] == ["ck", ".lock", "latest", "step-00000002", "verified"]


def test_a_file_size_limit_is_one_line_and_leaves_nothing_half_written(tmp_path):
    """(The up-front check skipped, as if the limit were lowered during the run: with it the
    run is refused before the first step, tests/test_outputs_keep_work.py.)"""
    def limit():  # ulimit -f 200 KiB: a checkpoint's state file (~950 KiB) goes past it
        resource.setrlimit(resource.RLIMIT_FSIZE, (200 << 10, 200 << 10))

    r = subprocess.run(train_cmd("--steps", "2", "--ckpt-dir", tmp_path, "--no-admission"), cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert r.returncode == 1, (r.stdout, r.stderr)
    line = _one_error_line(r.stderr)
    assert f"cannot write checkpoint {tmp_path}/step-00000002: file size limit reached (ulimit -f)" in line, line
    assert "raise the limit" in line
    assert os.listdir(tmp_path) == [".lock"] and not ckpt_mod.list_checkpoints(tmp_path)


@needs_tmpfs
def test_a_full_metrics_log_stops_the_run_with_one_line():
    """Issue 30 changed this from 'reported once, training goes on' (exit 0 with a truncated
    log): a run that promised a record does not succeed without it."""
    r = in_tmpfs('$TRAIN --steps 3 --log-file "$M/log.jsonl"; echo "rc=$?"', size="64k",
                 setup='(head -c 1048576 /dev/zero > "$M/fill" 2>/dev/null || true)')
    assert "rc=1" in r.stdout and "final loss" not in r.stdout, (r.stdout, r.stderr)
    assert _one_error_line(r.stderr) == ("horizon train: error: step 1: cannot write the metrics log /mnt/log.jsonl: "
                                         "no space left on the device (0 B free there); the run stopped; no "
                                         "checkpoint written")
