"""Issue 19, power loss: every file of a checkpoint or HF folder, and the folder itself, is
fsynced before the rename that publishes it, and the parent after it, so that after a power
loss the name never points at a folder whose contents were not on disk. Checked by recording
the fsync and rename calls in order (the same order `strace -f -e trace=fsync,rename` shows)."""
import os

import pytest

from horizon_exec.checkpoints import hf_checkpoint
from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


@pytest.fixture
def calls(monkeypatch):
    seen = []
    fsync, rename, replace = os.fsync, os.rename, os.replace

    def _fsync(fd):
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def _rename(a, b, *rest, **kw):
        seen.append(("rename", os.path.realpath(a), os.path.realpath(b)))
        return rename(a, b, *rest, **kw)

    def _replace(a, b, *rest, **kw):
        seen.append(("rename", os.path.realpath(a), os.path.realpath(b)))
        return replace(a, b, *rest, **kw)

    monkeypatch.setattr(os, "fsync", _fsync)
    monkeypatch.setattr(os, "rename", _rename)
    monkeypatch.setattr(os, "replace", _replace)
    return seen


def _published_durably(calls, final):
    """The rename onto `final`: each of its files and the folder fsynced before, the parent after."""
    final = os.path.realpath(final)
    i = next(k for k, c in enumerate(calls) if c[0] == "rename" and c[2] == final)
    tmp = calls[i][1]
    before = {c[1] for c in calls[:i] if c[0] == "fsync"}
    for name in os.listdir(final):
        assert os.path.join(tmp, name) in before, f"{name} not fsynced before the rename"
    assert tmp in before, "the folder itself not fsynced before the rename"
    assert ("fsync", os.path.dirname(final)) in calls[i + 1:], "the parent not fsynced after the rename"


def test_a_checkpoint_and_an_hf_folder_are_on_disk_before_their_names(tmp_path, calls):
    (tmp_path / "tokenizer.json").write_text("{}")   # a side file, copied (not written) into the HF folder
    with Trainer(SPEC, Policy(batch=1, seq=16), TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        step = ckpt_mod.save_checkpoint(tmp_path / "ck", tr, 1)
        out = hf_checkpoint.save_hf(tr, tmp_path / "hf", side_files=[tmp_path / "tokenizer.json"])
    _published_durably(calls, step)
    _published_durably(calls, out)
    assert (out / "tokenizer.json").is_file()
    i = next(k for k, c in enumerate(calls) if c[0] == "rename" and c[2] == str(tmp_path / "ck" / "latest"))
    assert calls[i - 1] == ("fsync", calls[i][1]) and calls[i + 1] == ("fsync", str(tmp_path / "ck"))
