"""Issue 43, item 4: the up-front space check counts the checkpoints a --ckpt-dir holds at once.
A save writes the new checkpoint beside the kept ones before it prunes, so --keep-ckpts K holds
K + 1 (two with --keep-ckpts 1); a check for one admitted a run that then failed at its second
checkpoint. A resumed run's checkpoints already there are used space. The free-space probe
(outputs.free_bytes) is replaced here: free space is set in checkpoints of the run."""
import pytest

from horizon_exec.train import outputs, save
from horizon_sim.cli.main import main
from tests.train_run import TINY

BASE = ["train", *TINY, "--compute-dtype", "fp32", "--no-working-copy"]

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


@pytest.fixture
def free_in_checkpoints(monkeypatch):
    """free_in_checkpoints(x): the file system has x checkpoints of the run free (the size the
    check itself computes: ckpt.checkpoint_bytes)."""
    seen, free = [], []
    real = save.checkpoint_bytes

    def spy(tr):
        seen.append(real(tr))
        return seen[-1]
    monkeypatch.setattr(save, "checkpoint_bytes", spy)
    monkeypatch.setattr(outputs, "free_bytes", lambda folder: int(free[-1] * seen[-1]) if seen else None)
    return free.append


def test_two_checkpoints_at_once_must_fit_or_the_run_is_refused_at_start(tmp_path, capsys, free_in_checkpoints):
    ck = tmp_path / "ck"
    argv = BASE + ["--steps", "2", "--ckpt-dir", str(ck), "--ckpt-interval", "1", "--keep-ckpts", "1"]
    free_in_checkpoints(1.5)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "final loss" not in out and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{str(ck)!r}: " in err and "free on its file system" in err and "need about" in err, err
    assert "--ckpt-dir" in err and "2 checkpoints of" in err and "at once" in err, err
    assert not list(ck.glob("step-*"))
    free_in_checkpoints(2.5)
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000002"]


def test_keep_ckpts_two_holds_three_at_once(tmp_path, capsys, free_in_checkpoints):
    argv = BASE + ["--steps", "3", "--ckpt-dir", str(tmp_path / "ck"), "--ckpt-interval", "1"]
    free_in_checkpoints(2.5)
    assert main(argv) == 2
    assert "3 checkpoints of" in capsys.readouterr().err


def test_a_resumed_run_counts_the_checkpoints_already_there_as_used(tmp_path, capsys, free_in_checkpoints):
    ck = tmp_path / "ck"
    free_in_checkpoints(3)
    assert main(BASE + ["--steps", "1", "--ckpt-dir", str(ck)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    # step-1 is there; the next save writes step-2 beside it, then prunes step-1: one more
    free_in_checkpoints(1.5)
    assert main(BASE + ["--steps", "2", "--ckpt-dir", str(ck), "--resume", "--keep-ckpts", "1"]) == 0, \
        capsys.readouterr().err
    capsys.readouterr()
    free_in_checkpoints(0.5)
    assert main(BASE + ["--steps", "3", "--ckpt-dir", str(ck), "--resume", "--keep-ckpts", "1"]) == 2
    err = capsys.readouterr().err
    assert "2 checkpoints of" in err and "already there" in err, err


@pytest.mark.parametrize("case", [
    # (existing {step: (bytes, complete)}, start, steps, save_every, keep) -> (extra bytes, at once)
    (({}, 0, 1, 0, 2), (10, 1)),                                     # one save only
    (({}, 0, 2, 1, 1), (20, 2)),                                     # --keep-ckpts 1: two at once
    (({}, 0, 10, 1, 2), (30, 3)),
    (({}, 0, 10, 2, 0), (50, 5)),                                    # keep all: every save adds one
    (({}, 0, 10**9, 1, 2), (30, 3)),                                 # no walk over a billion steps
    (({4: (10, True), 5: (10, True)}, 5, 10, 1, 1), (10, 3)),        # resumed: both pruned after the first save
    (({4: (10, True), 5: (10, True)}, 5, 10, 1, 3), (20, 4)),        # resumed: kept until there are 3 of its own
    (({4: (10, False), 5: (10, True)}, 5, 10, 1, 1), (10, 3)),       # an incomplete folder is never pruned
    (({5: (10, True), 8: (10, True)}, 5, 10, 1, 1), (10, 3)),        # a newer abandoned folder stays until passed
])
def test_the_peak_is_simulated_as_the_saves_prune(case):
    from horizon_exec.train.ckpt_space import Existing, ckpt_dir_need

    (existing, start, steps, every, keep), want = case
    need = ckpt_dir_need(10, {s: Existing(*e) for s, e in existing.items()}, start, steps, every, keep)
    assert (need.extra_bytes, need.at_once) == want
