"""Issue 19, item 11: the checkpoint pointer and the native kernel cache. A kill -9 between
publishing a step and updating `latest` resumes from that newest step (the leftover temporary
pointer file is removed by the next save); a damaged `latest` falls back to the step folders
with a warning; a `latest` naming a path (`../../x`) is never followed; a truncated cached
kernel `.so` is detected by its checksum and rebuilt instead of killing the process (SIGBUS)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.train_run import ROOT, env

SPEC = ModelSpec(n_layers=2, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)
POL = Policy(batch=1, seq=16, optimizer="after")

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

KILLED_BEFORE_POINTER = """
import os, signal, sys, torch
from horizon_exec.checkpoints import ckpt
from horizon_exec.checkpoints import fileio
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
root = sys.argv[1]
tr = Trainer(ModelSpec(n_layers=2, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256),
             Policy(batch=1, seq=16, optimizer="after"), TrainerConfig(admission=AdmissionConfig(enabled=False)))
g = torch.Generator().manual_seed(0)
tr.step(torch.randint(0, 256, (1, 16), generator=g))
ckpt.save_checkpoint(root, tr, 1)
tr.step(torch.randint(0, 256, (1, 16), generator=g))
real = fileio.write_text
def write_text(path, text):
    real(path, text)
    if os.path.basename(path).startswith(".latest."):   # step 2 is published, `latest` not yet updated
        os.kill(os.getpid(), signal.SIGKILL)
    return ""
fileio.write_text = write_text
ckpt.save_checkpoint(root, tr, 2)
"""


def _state(tr):
    return {n: t.clone() for n, t in tr.store.t.items() if not n.startswith("wc.")}


def test_killed_between_publishing_and_the_pointer_resumes_from_the_newest(tmp_path):
    r = subprocess.run([sys.executable, "-c", KILLED_BEFORE_POINTER, str(tmp_path)], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr
    assert (tmp_path / "latest").read_text() == "step-00000001\n"
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".latest.")]
    assert len(leftovers) == 1
    ckpt_mod.verify_checkpoint(tmp_path / "step-00000002")
    with Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        meta = ckpt_mod.load_checkpoint(tmp_path, tr, warn=pytest.fail)
        assert meta["step"] == 2 and ckpt_mod.latest_checkpoint(tmp_path).name == "step-00000002"
        tr.step(torch.randint(0, 256, (1, 16)))
        ckpt_mod.save_checkpoint(tmp_path, tr, 3)     # this run's save removes the dead run's leftover
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".latest.")]
    assert (tmp_path / "latest").read_text() == "step-00000003\n"


@pytest.fixture
def two_steps(tmp_path):
    root = tmp_path / "ck"
    states = {}
    with Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(enabled=False), seed=1)) as tr:
        for step in (1, 2):
            tr.step(torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(step)))
            ckpt_mod.save_checkpoint(root, tr, step)
            states[step] = _state(tr)
    return root, states


POINTERS = {
    "binary": b"\x00\xff\xfe garbage",
    "not ascii": "step-0000000\u0662\n".encode(),
    "empty": b"",
    "huge": b"step-00000002" * 100_000,
    "a path out of the folder": b"../../x\n",
    "an absolute path": b"/tmp\n",
    "a path through a step folder": b"step-00000001/../../x\n",
    "a folder": None,
}


@pytest.mark.parametrize("pointer", POINTERS)
def test_a_damaged_pointer_falls_back_to_the_step_folders(two_steps, pointer):
    root, states = two_steps
    shutil.copytree(root / "step-00000001", root.parent / "x")     # a decoy the path would lead to
    (root / "latest").unlink()
    if POINTERS[pointer] is None:
        (root / "latest").mkdir()
    else:
        (root / "latest").write_bytes(POINTERS[pointer])
    assert ckpt_mod.latest_checkpoint(root) == root / "step-00000002"
    warnings = []
    with Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        meta = ckpt_mod.load_checkpoint(root, tr, warn=warnings.append)
        assert meta["path"] == str(root / "step-00000002")
        assert all(torch.equal(t, states[2][n]) for n, t in _state(tr).items())
    if pointer != "empty":
        assert len(warnings) == 1 and warnings[0].startswith(f"warning: {root / 'latest'} "), warnings
        assert warnings[0].endswith("trying the step folders, newest first")


def test_an_abandoned_later_checkpoint_is_tried_last(tmp_path):
    """Resumed from step 1 while steps 2 and 3 exist (an older trajectory), the run wrote step 2
    again: a later resume takes the new step 2, not the old step 3."""
    with Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        for step in (1, 2, 3):
            ckpt_mod.save_checkpoint(tmp_path, tr, step, keep=0)
        ckpt_mod.load_checkpoint(tmp_path / "step-00000001", tr)
        ckpt_mod.save_checkpoint(tmp_path, tr, 2, keep=0)
    assert [p.name for p in ckpt_mod.candidates(tmp_path)] == ["step-00000002", "step-00000001", "step-00000003"]


def test_a_truncated_cached_kernel_is_rebuilt_not_loaded(tmp_path):
    from horizon_exec.optim import native
    if native.adamw() is None:
        pytest.skip(native.status())
    probe = [sys.executable, "-c", "from horizon_exec.optim import native; print(native.status())"]
    e = env(HORIZON_CACHE_DIR=str(tmp_path))
    first = subprocess.run(probe, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and "native AdamW kernel (" in first.stdout, first
    (so,) = (tmp_path / "native").glob("kernels-*.so")
    os.truncate(so, so.stat().st_size // 3)
    again = subprocess.run(probe, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again        # not killed by SIGBUS
    assert f"the cached {so.name} was damaged (its checksum does not match the build's): rebuilt" in again.stdout
    assert so.stat().st_size > 0 and "rebuilt" not in subprocess.run(
        probe, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300).stdout
