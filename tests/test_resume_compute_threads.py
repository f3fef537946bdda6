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
    """The uninterrupted run keeps its step-1 checkpoint; a second run resumes from it (into a
    folder of its own) with --compute-threads auto and must log the same steps 2 and 3."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    common = ["--steps", "3", "--compute-dtype", "fp32"]
    r = train(*common, "--save-every", "1", "--keep-ckpts", "0", "--compute-threads", threads,
              "--ckpt-dir", whole / "ck", "--log-file", whole / "log")
    assert r.returncode == 0, r.stderr
    r = train(*common, "--compute-threads", "auto", "--ckpt-dir", part / "ck", "--log-file", part / "log",
              "--resume", whole / "ck" / "step-00000001")
    assert r.returncode == 0, r.stderr
    assert f"cores: {threads}, as the run being resumed" in r.stdout, r.stdout
    resumed = _losses(part / "log")
    assert sorted(resumed) == [2, 3] and resumed == {s: v for s, v in _losses(whole / "log").items() if s > 1}
