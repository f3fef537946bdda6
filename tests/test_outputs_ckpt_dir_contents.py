"""Issue 43, items 8d and 8f: what a --ckpt-dir may hold and what may lie inside it
(train/ckpt_dir_rules.py). A folder holding anything but checkpoints and the run's own outputs
(`/`, `/etc` as root, a project folder) is refused unless --overwrite-ckpt, which then writes
beside those files and removes nothing but step folders; a name the checkpointer replaces or
removes (`latest`, `step-N`) that holds something else is refused even then; a --log-file or
--save-hf among the checkpointer's own files is refused naming both paths. Nothing is ever lost."""
import pytest

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.train_run import TINY

BASE = ["train", *TINY, "--steps", "1", "--compute-dtype", "fp32", "--no-working-copy"]

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _refused(capsys, argv, *words) -> str:
    assert main(BASE + [str(a) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert "final loss" not in out and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def _ran(capsys, argv):
    assert main(BASE + [str(a) for a in argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _tree(folder) -> dict:
    """path -> bytes (None: a folder) of everything under folder."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


def _etc(tmp_path):
    etc = tmp_path / "etc"
    (etc / "ssh").mkdir(parents=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "ssh" / "sshd_config").write_text("PermitRootLogin no\n")
    return etc


def test_a_folder_of_other_files_is_refused_and_overwrite_ckpt_writes_beside_them(tmp_path, capsys):
    etc = _etc(tmp_path)
    before = _tree(etc)
    _refused(capsys, ["--ckpt-dir", etc], f"--ckpt-dir {str(etc)!r} holds 3 entries that are not checkpoints",
             "(e.g. 'hosts')", "new or empty folder", "--overwrite-ckpt", "only step folders are ever removed")
    assert _tree(etc) == before   # not even a lock file left
    _ran(capsys, ["--ckpt-dir", etc, "--overwrite-ckpt"])
    after = _tree(etc)
    assert {k: v for k, v in after.items() if k in before} == before
    assert (etc / "latest").read_text().strip() == "step-00000001"


def test_overwrite_ckpt_removes_step_folders_and_nothing_else(tmp_path, capsys):
    ck = tmp_path / "ck"
    with Trainer(ModelSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=384),
                 Policy(batch=1, seq=16), TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        for s in (5, 10):
            ckpt_mod.save_checkpoint(ck, tr, s, keep=0)
    (ck / "notes.txt").write_text("mine\n")
    (ck / "plots").mkdir()
    (ck / "plots" / "loss.png").write_bytes(b"\x89PNG")
    _refused(capsys, ["--ckpt-dir", ck], "holds the checkpoints of an earlier run (2, newest step-00000010)")
    out = _ran(capsys, ["--ckpt-dir", ck, "--overwrite-ckpt"])
    assert "removed 2 checkpoint(s)" in out
    assert (ck / "notes.txt").read_text() == "mine\n" and (ck / "plots" / "loss.png").read_bytes() == b"\x89PNG"
    assert [p.name for p in ckpt_mod.list_checkpoints(ck)] == ["step-00000001"]


@pytest.mark.parametrize("what", ["latest of mine", "step folder of mine", "step file of mine"])
def test_a_name_the_checkpointer_replaces_is_refused_even_with_overwrite_ckpt(tmp_path, capsys, what):
    ck = tmp_path / "ck"
    ck.mkdir()
    if what == "latest of mine":
        (ck / "latest").write_text("the latest draft of my thesis\n")
        words = [f"--ckpt-dir {str(ck)!r}: its 'latest' names no checkpoint", "move it away"]
    elif what == "step folder of mine":
        (ck / "step-00000001").mkdir()
        (ck / "step-00000001" / "notes.txt").write_text("step one of my plan\n")
        words = ["'step-00000001' is named like a checkpoint folder but holds other things", "move it away"]
    else:
        (ck / "step-00000001").write_text("a file\n")
        words = ["'step-00000001' is named like a checkpoint folder"]
    before = _tree(ck)
    for extra in ([], ["--overwrite-ckpt"]):
        _refused(capsys, ["--ckpt-dir", ck, *extra], *words)
        assert _tree(ck) == before


def test_the_runs_own_files_beside_its_checkpoints_are_accepted(tmp_path, capsys):
    """The log and the HF save beside the checkpoints, a lock, a killed save's temporary, a
    file system's lost+found: a fresh run, its resume and a start over all go."""
    ck = tmp_path / "ck"
    (ck / "lost+found").mkdir(parents=True)
    (ck / ".step-00000007.otherhost-12.abc.tmp").mkdir()
    (ck / ".lock").write_text("")
    own = ["--ckpt-dir", ck, "--log-file", ck / "metrics.jsonl", "--save-hf", ck / "hf"]
    _ran(capsys, own)
    assert (ck / "hf" / "config.json").is_file() and (ck / "metrics.jsonl").is_file()
    _ran(capsys, own + ["--resume", "--steps", "2"])
    (ck / "notes.txt").write_text("mine\n")   # a folder of checkpoints: its other files are its owner's business
    _ran(capsys, own + ["--resume", "--steps", "3"])
    _ran(capsys, own + ["--overwrite-ckpt"])
    assert (ck / "notes.txt").read_text() == "mine\n"


def test_a_resume_into_a_folder_of_other_files_is_refused(tmp_path, capsys):
    _ran(capsys, ["--ckpt-dir", tmp_path / "ck"])
    etc = _etc(tmp_path)
    before = _tree(etc)
    err = _refused(capsys, ["--ckpt-dir", etc, "--resume", tmp_path / "ck" / "step-00000001", "--steps", "2"],
                   f"--ckpt-dir {str(etc)!r} holds 3 entries that are not checkpoints", "new or empty folder")
    assert "--overwrite-ckpt" not in err   # not allowed with --resume
    assert _tree(etc) == before


@pytest.mark.parametrize("flag,inside,name", [
    ("--log-file", "step-00000002/log.jsonl", "step-00000002"),
    ("--log-file", "latest", "latest"),
    ("--log-file", ".lock", ".lock"),
    ("--log-file", "node-0/step-00000001/log.jsonl", "step-00000001"),
    ("--save-hf", "step-00000001", "step-00000001"),
])
def test_an_output_among_the_checkpointers_own_files_is_refused(tmp_path, capsys, flag, inside, name):
    ck = tmp_path / "ck"
    path = ck / inside
    _refused(capsys, ["--ckpt-dir", ck, "--steps", "2", "--ckpt-interval", "1", flag, path],
             f"{flag} {str(path)!r} lies among the files the checkpointer owns in --ckpt-dir {str(ck)!r} "
             f"({name!r}: ")
    assert not list(ck.glob("step-*"))


def test_the_names_match_the_checkpointers():
    from horizon_exec.train import ckpt_dir_rules
    from horizon_exec.checkpoints import ckpt_lock
    assert ckpt_dir_rules.CHECKPOINT_FILES == {ckpt_mod.STATE, ckpt_mod.META, ckpt_mod.SUMS}
    assert (ckpt_dir_rules.LATEST, ckpt_dir_rules.LOCK) == (ckpt_mod.LATEST, ckpt_lock.LOCK)
