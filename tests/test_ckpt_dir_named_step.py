"""Issue 43, item 8a: a --ckpt-dir whose own name looks like a checkpoint (runs/step-7) was
written to but could not be resumed: resume took the folder for a checkpoint (its name) and
found no trainer.json in it. A folder named step-N that holds step folders and no checkpoint
files of its own is a ckpt_dir, resumed like any other (ckpt.candidates)."""
import pytest

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_sim.cli.main import main
from tests.train_run import TINY

BASE = ["train", *TINY, "--compute-dtype", "fp32", "--no-working-copy"]

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def test_a_ckpt_dir_named_like_a_step_folder_resumes(tmp_path, capsys):
    ck = tmp_path / "step-7"
    assert main(BASE + ["--steps", "1", "--ckpt-dir", str(ck)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(BASE + ["--steps", "2", "--ckpt-dir", str(ck), "--resume"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"resumed from {ck / 'step-00000001'} at step 1" in out, out
    assert (ck / "latest").read_text().strip() == "step-00000002"


def test_a_step_folder_without_step_folders_is_still_a_checkpoint(tmp_path):
    """What the name rule is for: a checkpoint folder that lost every file is tried (and
    reported damaged), not searched for step folders it cannot hold."""
    empty = tmp_path / "ck" / "step-00000003"
    empty.mkdir(parents=True)
    assert ckpt_mod.candidates(empty) == [empty]
    outer = tmp_path / "step-7"
    (outer / "step-00000002").mkdir(parents=True)
    (outer / "step-00000004").mkdir()
    assert ckpt_mod.candidates(outer) == [outer / "step-00000004", outer / "step-00000002"]
