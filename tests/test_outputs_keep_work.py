"""Issue 30, section 1: work on disk, or about to be written, is not lost. A fresh run does not
prune another run's checkpoints; --save-hf goes through a symbolic link into its target and is
one run's at a time; a symlinked lock file is refused (never truncated through); a file size
limit, a `latest` that is a folder or an empty output path are refused before the first step;
what --save-hf copies (config, tokenizer, side files) is read at the start, so a source folder
deleted or swapped mid-run changes nothing; a path that cannot be used is named; `latest` and
lock files follow the umask."""
import fcntl
import json
import os
import resource
import shutil
import stat

import pytest

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.checkpoints import hf_checkpoint
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_exec.train.loop import TrainLoop
from horizon_sim.cli.main import main
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.train_run import MICRO

BASE = ["train", "--model", str(MICRO), "--steps", "1", "--batch", "2", "--seq", "32", "--no-progress",
        "--eval-batches", "0", "--compute-dtype", "fp32", "--no-working-copy"]
SPEC = ModelSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=384)
POL = Policy(batch=1, seq=16)

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _refused(capsys, argv, *words) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "final loss" not in out and "Traceback" not in err, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def _checkpoints(ck, *steps):
    with Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        for s in steps:
            ckpt_mod.save_checkpoint(ck, tr, s, keep=0)


def test_a_fresh_run_keeps_another_runs_checkpoints_unless_told_to_start_over(tmp_path, capsys):
    ck = tmp_path / "ck"
    _checkpoints(ck, 5, 10)
    _refused(capsys, BASE + ["--ckpt-dir", str(ck), "--save-every", "1"],
             f"--ckpt-dir {str(ck)!r} holds the checkpoints of an earlier run (2, newest step-00000010)",
             "--resume", "--overwrite-ckpt")
    assert [p.name for p in ckpt_mod.list_checkpoints(ck)] == ["step-00000005", "step-00000010"]
    for p in ckpt_mod.list_checkpoints(ck):
        ckpt_mod.verify_checkpoint(p)
    assert main(BASE + ["--ckpt-dir", str(ck), "--overwrite-ckpt"]) == 0
    assert f"--overwrite-ckpt: removed 2 checkpoint(s) of an earlier run from {ck}" in capsys.readouterr().out
    assert [p.name for p in ckpt_mod.list_checkpoints(ck)] == ["step-00000001"]
    assert (ck / "latest").read_text() == "step-00000001\n"


@pytest.mark.parametrize("target", ["missing", "an empty folder"])
def test_save_hf_through_a_symlink_writes_into_its_target(tmp_path, capsys, target):
    real = tmp_path / "real"
    if target != "missing":
        real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert main(BASE + ["--save-hf", str(link)]) == 0, capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == str(real)   # the link is kept
    assert (real / "model.safetensors").is_file() and (real / "config.json").is_file()


def test_a_second_run_saving_to_the_same_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    fd = os.open(tmp_path / ".out.lock", os.O_RDWR | os.O_CREAT)   # another run holds it (flock is per open)
    try:
        os.write(fd, b"pid 4242 on host elsewhere, since 2026-01-01T00:00:00\n")
        fcntl.flock(fd, fcntl.LOCK_EX)
        _refused(capsys, BASE + ["--save-hf", str(out)], f"--save-hf {str(out)!r} is in use by another run "
                 f"(pid 4242 on host elsewhere, since 2026-01-01T00:00:00; lock {tmp_path / '.out.lock'})")
    finally:
        os.close(fd)
    assert not out.exists()


@pytest.mark.parametrize("which", ["--ckpt-dir", "--save-hf"])
def test_a_symlinked_lock_file_is_refused_and_what_it_points_to_kept(tmp_path, capsys, which):
    victim = tmp_path / "precious.txt"
    victim.write_text("mine\n")
    if which == "--ckpt-dir":
        (tmp_path / "ck").mkdir()
        (tmp_path / "ck" / ".lock").symlink_to(victim)
    else:
        (tmp_path / ".ck.lock").symlink_to(victim)
    _refused(capsys, BASE + [which, str(tmp_path / "ck")], "is a symbolic link", ".lock")
    assert victim.read_text() == "mine\n"


@pytest.mark.parametrize("flag", ["--ckpt-dir", "--save-hf"])
def test_a_file_size_limit_below_an_output_is_refused_up_front(tmp_path, capsys, flag):
    """The micro model's checkpoint state is ~950 KiB, its bf16 HF shard ~140 KiB."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100 << 10, hard))
    try:
        rc = main(BASE + [flag, str(tmp_path / "o")])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    out, err = capsys.readouterr()
    assert rc == 2 and "final loss" not in out, (out, err)
    assert f"{flag}: {tmp_path / 'o'}" in err and "over this process's file size limit of 100.0 KiB (ulimit -f)" in err


def test_the_save_copies_what_the_run_started_with(tmp_path, capsys, monkeypatch):
    """--init-from deleted and the --tokenizer folder swapped while the run trains."""
    from tests.hf_tokenizers import bpe

    init, tok, out = tmp_path / "init", tmp_path / "tok", tmp_path / "out"
    with Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        hf_checkpoint.save_hf(tr, init)
    (init / "generation_config.json").write_text('{"max_length": 77}\n')
    tok.mkdir()
    bpe().save(str(tok / "tokenizer.json"))
    config, tokenizer = json.loads((init / "config.json").read_text()), (tok / "tokenizer.json").read_bytes()
    (tmp_path / "data.txt").write_text("def f(x):\n    return x + 1\n" * 200)
    run = TrainLoop.run

    def meanwhile(self, *a, **k):
        shutil.rmtree(init)
        (tok / "tokenizer.json").write_text('{"swapped": true}\n')
        return run(self, *a, **k)

    monkeypatch.setattr(TrainLoop, "run", meanwhile)
    argv = ["train", "--init-from", str(init), "--tokenizer", str(tok), "--data", str(tmp_path / "data.txt"),
            "--steps", "1", "--batch", "2", "--seq", "16", "--no-progress", "--eval-batches", "0",
            "--compute-dtype", "fp32", "--no-working-copy", "--save-hf", str(out), "--save-dtype", "fp32"]
    assert main(argv) == 0, capsys.readouterr().err
    assert (out / "tokenizer.json").read_bytes() == tokenizer
    assert (out / "generation_config.json").read_text() == '{"max_length": 77}\n'
    assert json.loads((out / "config.json").read_text()) == config


@pytest.mark.parametrize("flag", ["--save-hf", "--ckpt-dir", "--log-file"])
def test_an_empty_output_path_is_refused(capsys, flag):
    _refused(capsys, BASE + [flag, ""], f"{flag} is empty; give a path")


def test_latest_as_a_folder_is_refused_before_the_run(tmp_path, capsys):
    """(The resume itself would work: it orders the step folders; the last checkpoint would not.)"""
    ck = tmp_path / "ck"
    assert main(BASE + ["--ckpt-dir", str(ck)]) == 0
    capsys.readouterr()
    (ck / "latest").unlink()
    (ck / "latest").mkdir()
    _refused(capsys, BASE + ["--ckpt-dir", str(ck), "--resume", "--steps", "2"],
             f"--ckpt-dir: {str(ck / 'latest')!r} is a folder")


def test_a_path_that_cannot_be_used_is_named(tmp_path, capsys):
    long = tmp_path / ("x" * 300)
    _refused(capsys, BASE + ["--save-hf", str(long)], f"cannot use {str(long)!r}: name too long")


def test_latest_and_lock_files_follow_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        _checkpoints(tmp_path / "ck", 1)
    finally:
        os.umask(old)
    for f in ("latest", ".lock"):
        assert stat.S_IMODE((tmp_path / "ck" / f).stat().st_mode) == 0o664, f
