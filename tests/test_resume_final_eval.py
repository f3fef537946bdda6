"""A run killed after a step's checkpoint but before that step's eval finished (the checkpoint
is written first: loop.py) resumes and runs the eval it missed, with the uninterrupted run's
loss bit for bit (fp32); at the last step the resume also writes --save-hf and prints the
summary, rather than 'nothing to do' (issue 43, item 2). An eval the checkpoint records (a
stop after the eval) is not redone. The kill is simulated in process: the eval raises an
exception no handler of the run catches, as a SIGKILL leaves nothing to run."""
import json

import pytest

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.data.data import load_dataset
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_exec.train.loop import LoopConfig, TrainLoop
from horizon_sim.cli.main import main
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import exact_policy
from tests.train_run import MICRO

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


class Killed(BaseException):
    """The process dies here (no except clause of the run catches a BaseException)."""


def _kill_at_eval(monkeypatch, evals_before_kill: int = 0):
    real, calls = Trainer.eval_loss, []

    def eval_loss(self, *a, **kw):
        calls.append(1)
        if len(calls) > evals_before_kill:
            raise Killed()
        return real(self, *a, **kw)

    monkeypatch.setattr(Trainer, "eval_loss", eval_loss)


def _argv(root, steps=3):
    return ["train", "--model", str(MICRO), "--batch", "2", "--seq", "32", "--no-progress", "--steps", str(steps),
            "--compute-dtype", "fp32", "--eval-batches", "2", "--ckpt-dir", str(root / "ck"),
            "--log-file", str(root / "log.jsonl"), "--save-hf", str(root / "out")]


def _logged(root):
    return [json.loads(line) for line in (root / "log.jsonl").read_text().splitlines()]


def _eval_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("step 3: eval loss"))


def test_a_kill_during_the_final_eval_resumes_to_the_eval_save_hf_and_summary(tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "uninterrupted", tmp_path / "killed"
    assert main(_argv(a)) == 0
    out_a = capsys.readouterr().out
    final_a = next(line for line in out_a.splitlines() if line.startswith("final loss"))

    with monkeypatch.context() as killing:  # undone after, leaving conftest's patches
        _kill_at_eval(killing)
        with pytest.raises(Killed):
            main(_argv(b))
    capsys.readouterr()
    assert ckpt_mod.latest_checkpoint(b / "ck").name == "step-00000003"   # the checkpoint came before the eval
    assert not any("eval_loss" in r for r in _logged(b)) and not (b / "out").exists()

    assert main(_argv(b) + ["--resume"]) == 0
    out_b = capsys.readouterr().out
    assert _eval_line(out_b) == _eval_line(out_a)
    assert ("the run was at its last step (3 of 3): ran the final eval its checkpoint did not hold; "
            f"writes --save-hf {b / 'out'}") in out_b
    assert "nothing to do" not in out_b
    # the summary: the last step's loss and grad norm (from the checkpoint) and the eval, as the uninterrupted run's
    loss_a, ev_a, gn_a = (final_a.split(k)[1].split()[0] for k in ("final loss ", "eval loss ", "grad norm "))
    assert f"final loss {loss_a}  eval loss {ev_a}  grad norm {gn_a} (step 3; no step ran in this process)" in out_b
    # the metrics log gets the eval line, the value bit for bit
    eval_a = [r for r in _logged(a) if "eval_loss" in r]
    assert [r for r in _logged(b) if "eval_loss" in r] == eval_a and len(eval_a) == 1
    assert [r["loss"] for r in _logged(b) if "loss" in r] == [r["loss"] for r in _logged(a) if "loss" in r]
    # --save-hf: the same weights
    assert (b / "out" / "model.safetensors").read_bytes() == (a / "out" / "model.safetensors").read_bytes()

    # resumed again: the eval is redone (the checkpoint still does not hold it), to the same value
    assert main(_argv(b) + ["--resume"]) == 0
    assert _eval_line(capsys.readouterr().out) == _eval_line(out_a)


SPEC = ModelSpec(n_layers=2, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)
POL = exact_policy(batch=2, seq=16, optimizer="pipelined", grad_clip=0.5)


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(None, ByteTokenizer(), seq=16, eval_fraction=0.01)


def _loop(ds, ckpt_dir=None, seed=0, steps=4, save_every=2):
    tr = Trainer(SPEC, POL, TrainerConfig(optimizer=OptimizerConfig(lr=3e-3), seed=seed))
    cfg = LoopConfig(steps=steps, lr_schedule=CosineSchedule(peak=3e-3, total_steps=steps), eval_every=2,
                     eval_batches=2, ckpt_dir=ckpt_dir and str(ckpt_dir), save_every=save_every, keep_ckpts=0,
                     progress=False, handle_signals=False)
    return tr, TrainLoop(tr, ds, cfg, seed=5, out=lambda *_: None)


def test_a_kill_during_an_intermediate_eval_resumes_to_that_eval(tmp_path, dataset, monkeypatch):
    tr, loop = _loop(dataset)
    with tr, loop:
        loop.run()
        want, losses = dict(loop.evals), dict(loop.losses)
    assert set(want) == {2, 4}
    with monkeypatch.context() as killing:
        _kill_at_eval(killing)            # dies in the eval after step 2, its checkpoint written
        tr, loop = _loop(dataset, tmp_path)
        with tr, loop, pytest.raises(Killed):
            loop.run()
    tr, loop = _loop(dataset, tmp_path, seed=9)
    with tr, loop:
        assert loop.resume(tmp_path).name == "step-00000002" and loop.eval_owed
        loop.run()
        assert loop.evals == want and loop.eval_redone == 2   # bit for bit
        assert {s: loop.losses[s] for s in (2, 3)} == {s: losses[s] for s in (2, 3)}


def test_an_eval_the_checkpoint_holds_is_not_redone(tmp_path, dataset, monkeypatch):
    """No save due at step 2 (save_every 3): a stop after the eval of step 2 checkpoints step 2
    with the eval's result; the resume takes it from there."""
    tr, loop = _loop(dataset, tmp_path, save_every=3)
    with tr, loop:
        loop.run(until=2)
        want = loop.evals[2]
        loop.save()                      # what a signal after the eval does (_stop_at_boundary)
    assert ckpt_mod.read_meta(tmp_path / "step-00000002")["loop"]["eval"] == {"step": 2, "eval_loss": want}
    _kill_at_eval(monkeypatch, evals_before_kill=0)   # any eval run now would die
    tr, loop = _loop(dataset, tmp_path, save_every=3)
    with tr, loop:
        loop.resume(tmp_path)
        assert not loop.eval_owed and loop.evals == {2: want}
        loop.run(until=2)                # no eval redone, nothing to do
        assert loop.eval_redone is None
