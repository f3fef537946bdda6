"""Issue 19, items 10 and 13 (messages): signals at the edges of a run. SIGTERM during the last
step's eval stops the run (exit 143) without --save-hf, which a --resume then writes; SIGTERM
during --save-hf finishes the save and exits 143, a second one aborts it leaving nothing
half-written; an abort message names what was abandoned (not a wrong step number) and says
"none written yet" rather than "no ckpt_dir" when a ckpt_dir is set."""
import os
import signal

import pytest
from safetensors import safe_open

from horizon_exec.checkpoints import hf_checkpoint
from horizon_exec.data.data import load_dataset
from horizon_exec.train.loop import Interrupted, LoopConfig, TrainLoop
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from tests.train_run import MICRO
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import exact_policy

BASE = ["train", "--model", str(MICRO), "--batch", "2", "--seq", "32", "--no-progress", "--steps", "3"]


def _sigterm(times: int = 1):
    for _ in range(times):
        os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_the_last_eval_stops_without_save_hf(tmp_path, capsys, monkeypatch):
    real = Trainer.eval_loss
    sent = []

    def eval_loss(self, *a, **kw):
        if not sent:
            sent.append(1)
            _sigterm()
        return real(self, *a, **kw)

    monkeypatch.setattr(Trainer, "eval_loss", eval_loss)
    argv = BASE + ["--eval-batches", "1", "--ckpt-dir", str(tmp_path / "ck"), "--save-hf", str(tmp_path / "out")]
    assert main(argv) == 143
    err = capsys.readouterr().err
    assert (f"horizon train: SIGTERM: stopped after step 3; last checkpoint {tmp_path / 'ck' / 'step-00000003'}; "
            "resume with --resume") in err
    assert not (tmp_path / "out").exists()
    # the run is at its last step: the resume writes --save-hf, and redoes the eval (the checkpoint of
    # step 3 was written before it: test_resume_final_eval)
    assert main(argv + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "the run was at its last step (3 of 3): ran the final eval its checkpoint did not hold" in out
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.fixture
def signal_mid_save(monkeypatch):
    """write_safetensors of the HF save gets `times` SIGTERMs after its first tensor."""
    real = hf_checkpoint.write_safetensors
    box = {"times": 1}

    def write(path, items, metadata=None):
        real(str(path) + ".part", items[:1], metadata)
        os.unlink(str(path) + ".part")
        _sigterm(box["times"])
        return real(path, items, metadata)

    monkeypatch.setattr(hf_checkpoint, "write_safetensors", write)
    return box


def test_one_sigterm_during_save_hf_finishes_it_and_exits_143(tmp_path, capsys, signal_mid_save):
    assert main(BASE + ["--eval-batches", "0", "--save-hf", str(tmp_path / "out")]) == 143
    out, err = capsys.readouterr()
    assert f"saved bf16 HF checkpoint to {tmp_path / 'out'}" in out
    assert err.strip().endswith("horizon train: SIGTERM: stopped after step 3 (after completing --save-hf); "
                                "no checkpoint (no --ckpt-dir)"), err
    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as f:
        assert "model.embed_tokens.weight" in f.keys()


def test_a_second_sigterm_aborts_save_hf_and_leaves_nothing(tmp_path, capsys, signal_mid_save):
    signal_mid_save["times"] = 2
    (tmp_path / "mine.txt").write_text("x")
    ck = tmp_path / "ck"
    assert main(BASE + ["--eval-batches", "0", "--save-hf", str(tmp_path / "out"), "--ckpt-dir", str(ck)]) == 143
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"horizon train: SIGTERM: aborted during --save-hf {tmp_path / 'out'}; last checkpoint "
                        f"{ck / 'step-00000003'}; resume with --resume"), err
    assert sorted(os.listdir(tmp_path)) == ["ck", "mine.txt"]   # no folder, no hidden leftover


SPEC = ModelSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256)


@pytest.mark.parametrize("ckpt_dir", [True, False])
def test_an_abort_names_what_it_abandoned(tmp_path, ckpt_dir):
    ds = load_dataset(None, ByteTokenizer(), seq=16, eval_fraction=0.05)
    with Trainer(SPEC, exact_policy(batch=2, seq=16)) as tr:
        cfg = LoopConfig(steps=6, lr_schedule=CosineSchedule(peak=1e-3, total_steps=6), eval_every=2, eval_batches=1,
                         ckpt_dir=str(tmp_path) if ckpt_dir else None, progress=False)
        loop = TrainLoop(tr, ds, cfg, out=lambda *_: None)
        real = tr.eval_loss
        tr.eval_loss = lambda *a: (_sigterm(2), real(*a))[1]   # two SIGTERMs in the first eval
        with pytest.raises(Interrupted) as e:
            loop.run()
    want = "none written yet" if ckpt_dir else "no ckpt_dir"
    assert str(e.value) == f"SIGTERM: aborted during the eval after step 2; no checkpoint ({want})"


@pytest.fixture
def disposition():
    """disposition(sig, how): `sig`'s disposition for the test (how pytest was started, under
    nohup or as a background job, must not decide it), each put back after."""
    was = {}

    def set_(sig, how):
        old = signal.signal(sig, how)
        was.setdefault(sig, old)   # the first: what the test found
    yield set_
    for sig, how in was.items():
        signal.signal(sig, how)


@pytest.fixture
def sighup(disposition):
    """sighup(how): SIGHUP's disposition for the test."""
    return lambda how: disposition(signal.SIGHUP, how)


def test_sighup_stops_at_a_checkpoint_like_sigterm_exit_129(tmp_path, capsys, monkeypatch, sighup):
    """Issue 30: the terminal or ssh session going away (SIGHUP) killed the run at once, losing
    the steps since the last checkpoint; it is a stop request like SIGTERM."""
    sighup(signal.SIG_DFL)
    real = Trainer.step

    def step(self, *a, **kw):
        os.kill(os.getpid(), signal.SIGHUP)
        return real(self, *a, **kw)

    monkeypatch.setattr(Trainer, "step", step)
    ck = tmp_path / "ck"
    assert main(BASE + ["--eval-batches", "0", "--compute-dtype", "fp32", "--no-working-copy",
                        "--ckpt-dir", str(ck)]) == 129
    err = capsys.readouterr().err
    assert (f"horizon train: SIGHUP: stopped after step 1; last checkpoint {ck / 'step-00000001'}; "
            "resume with --resume") in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL   # the handler was put back


def test_a_run_started_ignoring_sighup_trains_through_a_hangup(tmp_path, capsys, monkeypatch, sighup):
    """`nohup horizon train` ignores SIGHUP so that the run outlives the terminal: the stop
    handler installed over SIG_IGN made a hang-up stop it at the next step (exit 129)."""
    sighup(signal.SIG_IGN)
    real = Trainer.step
    steps = []

    def step(self, *a, **kw):
        os.kill(os.getpid(), signal.SIGHUP)
        steps.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(Trainer, "step", step)
    assert main(BASE + ["--eval-batches", "0", "--compute-dtype", "fp32", "--no-working-copy"]) == 0
    assert len(steps) == 3 and "SIGHUP" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_the_launcher_leaves_an_ignored_signal_ignored(disposition, sighup):
    """torch.distributed.run's launcher handles SIGHUP over SIG_IGN unless told which signals to
    handle: a `nohup` data-parallel run would stop its ranks on a hang-up."""
    from horizon_exec.dist.launch import ELASTIC_SIGNALS, elastic_signals
    for name in ELASTIC_SIGNALS.split(","):  # a foreground run's
        disposition(getattr(signal, name), signal.SIG_DFL)
    assert elastic_signals(None) == ELASTIC_SIGNALS == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    sighup(signal.SIG_IGN)
    assert elastic_signals(None) == "SIGTERM,SIGINT,SIGQUIT"
    assert elastic_signals("SIGHUP, SIGUSR1") == "SIGUSR1"   # the user's own list, less the ignored
    assert elastic_signals("SIGHUP") == "SIGTERM"             # torch registers at least one
