"""Issue 30, 3: the --log-file metrics log is strict JSON (a NaN or infinite value is null) and a
log that cannot be written (full disk, /dev/full) stops the run with one line naming the path,
exit 1, at the first line that does not fit."""
import json
import math

import pytest

from horizon_exec.train.loop import metrics_line
from horizon_sim.cli.main import main
from tests.train_run import TINY

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _strict(line: str):
    def refuse(c):
        raise ValueError(f"not JSON: {c}")
    return json.loads(line, parse_constant=refuse)


def test_non_finite_values_are_written_as_null():
    lines = [metrics_line({"step": 1, "loss": math.nan, "grad_norm": math.inf, "lr": 1e-3, "skipped": True}),
             metrics_line({"step": 1, "eval_loss": -math.inf})]
    assert all(ln.endswith("\n") and ln.count("\n") == 1 for ln in lines)
    assert [_strict(ln) for ln in lines] == [
        {"step": 1, "loss": None, "grad_norm": None, "lr": 1e-3, "skipped": True}, {"step": 1, "eval_loss": None}]


def test_a_log_that_cannot_be_written_stops_the_run(tmp_path, capsys):
    ck = tmp_path / "ck"
    rc = main(["train", *TINY, "--compute-dtype", "fp32", "--no-working-copy", "--steps", "3",
               "--log-file", "/dev/full", "--ckpt-dir", str(ck)])
    out, err = capsys.readouterr()
    assert rc == 1, (out, err)
    assert err.strip() == (f"horizon train: error: step 1: cannot write the metrics log /dev/full: no space left on "
                           f"the device ({err.split('device (')[1].split(')')[0]}); the run stopped; last checkpoint "
                           f"{ck}/step-00000001 (step 1)"), err
    assert "final loss" not in out and f"step 1: checkpoint {ck}/step-00000001" in out
