"""Issue 19, item 13 (the rest): checkpoint and HF folders get the umask's permissions, not
mkdtemp's 0700; --init-from with --resume says which weights the run continues from."""
import os
import stat

import pytest

from horizon_exec.checkpoints import hf_checkpoint
from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_published_folders_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        with Trainer(SPEC, Policy(batch=1, seq=16), TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
            step = ckpt_mod.save_checkpoint(tmp_path / "ck", tr, 1)
            out = hf_checkpoint.save_hf(tr, tmp_path / "hf")
    finally:
        os.umask(old)
    for folder in (step, out):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask, folder


def test_init_from_with_resume_says_where_the_weights_come_from(tmp_path, capsys):
    with Trainer(SPEC, Policy(batch=1, seq=16), TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        hf_checkpoint.save_hf(tr, tmp_path / "hf")     # an HF folder to start from
    argv = ["train", "--init-from", str(tmp_path / "hf"), "--tokenizer", "bytes", "--batch", "2", "--seq", "16", "--no-progress",
            "--eval-batches", "0", "--ckpt-dir", str(tmp_path / "ck")]
    assert main(argv + ["--steps", "1"]) == 0
    assert f"weights from {tmp_path / 'hf'}" in capsys.readouterr().out
    assert main(argv + ["--steps", "2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"weights from {tmp_path / 'hf'}" not in out
    assert (f"--init-from {tmp_path / 'hf'}: its config, tokenizer and side files are used; the weights and "
            "optimizer state come from the checkpoint") in out
