"""A resume takes the compute threads of the run it continues (issue 43's kill-resume benchmark
found it): with --compute-threads auto the planner's choice rests on this machine's
description, which a new calibration or a re-measured estimate can change between the two
processes, and a GEMM on another thread count sums in another order, so the resumed steps
were not the uninterrupted run's bit for bit. The checkpoint records the threads
(state_items.py 'runtime'), and train_cmd pins 'auto' to them."""
import json
import os

import pytest

from tests.train_run import train

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for two thread counts")


def _losses(log) -> dict:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, log.read_text().splitlines())
            if "loss" in r}


@pytest.mark.parametrize("threads", [1, 2])
def test_auto_resumes_on_the_threads_the_checkpoint_was_written_with(tmp_path, threads):
    whole, part = tmp_path / "whole", tmp_path / "part"
    common = ["--steps", "3", "--save-every", "1", "--compute-dtype", "fp32"]
    r = train(*common, "--compute-threads", threads, "--ckpt-dir", whole / "ck", "--log-file", whole / "log")
    assert r.returncode == 0, r.stderr
    r = train("--steps", "1", "--compute-dtype", "fp32", "--compute-threads", threads,
              "--ckpt-dir", part / "ck", "--log-file", part / "log")
    assert r.returncode == 0, r.stderr
    r = train(*common, "--compute-threads", "auto", "--ckpt-dir", part / "ck", "--log-file", part / "log", "--resume")
    assert r.returncode == 0, r.stderr
    assert f"cores: {threads}, as the run being resumed" in r.stdout, r.stdout
    assert _losses(part / "log") == _losses(whole / "log")
