"""Issue 19, item 9: a stuck op is noticed after the op timeout (a flag, default 120 s, instead
of a fixed 600 s), and one SIGTERM ends a stuck step: after a stop request a step that makes no
progress for engine.STOP_GRACE_S is abandoned, and the run stops as an immediate Interrupted
(exit 143 from the CLI) instead of waiting for a boundary that never comes."""
import os
import signal
import threading
import time

import pytest
import torch

from horizon_exec.runtime import engine as engine_mod
from horizon_exec.data.data import load_dataset
from horizon_exec.runtime.engine import Engine
from horizon_exec.train.loop import Interrupted, LoopConfig, TrainLoop
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.runtime.config import RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from tests.train_run import MICRO
from horizon_sim.schedule import OpKind
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import exact_policy

SPEC = ModelSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256)

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _stuck_in(step_of, at_step, release: threading.Event, kind=OpKind.BACKWARD):
    """An engine hook: the first op of `kind` in step `at_step` blocks until `release` (20 s at
    most, so a run that cannot abandon it still ends)."""
    fired = []

    def hook(op):
        if step_of() == at_step and op.kind == kind and not fired:
            fired.append(op)
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()   # one SIGTERM
            release.wait(20)
    return hook


def test_one_sigterm_ends_a_stuck_step(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_mod, "STOP_GRACE_S", 0.5, raising=False)
    ds = load_dataset(None, ByteTokenizer(), seq=16, eval_fraction=0.01)
    pol = exact_policy(batch=2, seq=16)
    release = threading.Event()
    tr = Trainer(SPEC, pol, TrainerConfig(runtime=RuntimeConfig(timeout_s=600)))
    try:
        cfg = LoopConfig(steps=10, lr_schedule=CosineSchedule(peak=1e-3, total_steps=10), eval_batches=0,
                         ckpt_dir=str(tmp_path), save_every=2, progress=False)
        loop = TrainLoop(tr, ds, cfg, out=lambda *_: None)
        tr.engine.hook = _stuck_in(lambda: loop.step, 2, release)
        with pytest.raises(Interrupted) as e:
            loop.run()
        assert e.value.immediate and not release.is_set()   # abandoned while the op was still stuck
        stuck = e.value.__cause__.op
        tr.close()                    # and closing does not wait for the stuck lane
    finally:
        release.set()
        tr.close()
    assert e.value.immediate and e.value.exit_code == 143 and stuck.kind == OpKind.BACKWARD
    assert str(e.value) == (f"SIGTERM: aborted during step 3 (op {stuck.id} {stuck.label} made no progress); "
                            f"last checkpoint {tmp_path / 'step-00000002'}")


def test_the_op_timeout_is_a_flag(tmp_path, capsys, monkeypatch):
    real_init = Engine.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        self.hook = lambda op: time.sleep(3) if op.kind == OpKind.OPTIMIZER else None

    monkeypatch.setattr(Engine, "__init__", init)
    argv = ["train", "--model", str(MICRO), "--steps", "2", "--batch", "2", "--seq", "32", "--no-progress",
            "--eval-batches", "0", "--op-timeout", "0.5"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no op started or finished for 0.5s (the op timeout; raise it" in err
    assert "in op" in err and "optimizer" in err, err
    assert main(argv[:-1] + ["0"]) == 2
    assert "--op-timeout 0.0 must be a positive number of seconds" in capsys.readouterr().err


def test_a_long_queue_is_not_a_stall():
    """Progress is any op starting or finishing: a lane waiting on another lane's long queue of
    quick ops is not stuck, even past the op timeout."""
    pol = exact_policy(batch=2, seq=16)
    with Trainer(SPEC, pol, TrainerConfig(runtime=RuntimeConfig(timeout_s=0.4))) as tr:
        tr.engine.hook = lambda op: time.sleep(0.05)   # every op slow: a step takes far more than 0.4 s
        tr.step(torch.randint(0, SPEC.vocab, (2, 16)))
