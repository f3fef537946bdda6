"""Issue 19, item 7: eval runs inside the fault handling. An eval that fails is one line
(exit 1), not a traceback; the step's checkpoint is written before the eval at the last step,
and an eval failing mid-run leaves a checkpoint of its step."""
import pytest

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from tests.train_run import MICRO

BASE = ["train", "--model", str(MICRO), "--batch", "2", "--seq", "32", "--no-progress", "--eval-batches", "1"]


@pytest.fixture
def eval_fails(monkeypatch):
    def broken(self, tokens, labels=None, docs=None):
        raise RuntimeError("out of memory (injected)")
    monkeypatch.setattr(Trainer, "eval_loss", broken)


@pytest.mark.parametrize("when,argv,step", [
    ("the last step", ["--steps", "3"], 3),
    ("mid-run", ["--steps", "6", "--eval-every", "2"], 2),
])
def test_an_eval_failure_is_one_line_and_keeps_the_step(tmp_path, capsys, eval_fails, when, argv, step):
    assert main(BASE + argv + ["--ckpt-dir", str(tmp_path), "--save-hf", str(tmp_path.parent / "hf")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"horizon train: error: step {step}: eval failed: RuntimeError: out of memory (injected); "
                   f"last checkpoint {tmp_path / ckpt_mod.step_dir_name(step)} (step {step}); resume with "
                   "--resume, or with --eval-batches 0 if the eval keeps failing")
    assert ckpt_mod.latest_checkpoint(tmp_path).name == ckpt_mod.step_dir_name(step)
    ckpt_mod.verify_checkpoint(tmp_path / ckpt_mod.step_dir_name(step))
    assert not (tmp_path.parent / "hf").exists()   # a failed run does not publish its weights as trained


def test_a_lane_fault_is_one_line_with_the_traceback_on_request(tmp_path, capsys, monkeypatch):
    from horizon_exec.runtime.engine import Engine
    real_init = Engine.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        seen = []

        def hook(op):
            seen.append(op)
            if len(seen) == 25:    # in the second step (17 ops a step)
                raise RuntimeError("bad op (injected)")
        self.hook = hook

    monkeypatch.setattr(Engine, "__init__", init)
    assert main(BASE + ["--steps", "3", "--ckpt-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "failed: RuntimeError: bad op (injected)" in err, err
    assert err.startswith("horizon train: error: op ") and err.endswith("(HORIZON_DEBUG=1 shows the traceback)")
    monkeypatch.setenv("HORIZON_DEBUG", "1")
    assert main(BASE + ["--steps", "3", "--ckpt-dir", str(tmp_path / "again")]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err
