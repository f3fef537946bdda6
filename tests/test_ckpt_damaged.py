"""Damaged checkpoints (issue 7): a corrupted, truncated or missing file is detected on load
(checksums, verified while reading) with an error naming the file; given a ckpt_dir the
loader falls back to the previous intact checkpoint with a warning; a failed load never
leaves a trainer that silently trains on half-loaded state."""
import os

import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.checkpoints.ckpt import CheckpointError
from horizon_exec.data.data import load_dataset
from horizon_exec.errors import ExecError
from horizon_exec.train.loop import LoopConfig, TrainLoop
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.runtime.config import TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256)
POL = Policy(batch=2, seq=16, optimizer="pipelined")  # pending gradients are part of the state


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _state(tr) -> dict:
    out = {n: t.clone() for n, t in tr.store.t.items() if not n.startswith("wc.")}
    out.update({f"steps.{u}": s.clone() for u, s in tr.store.steps.items()})
    return out


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.fixture
def two_checkpoints(tmp_path):
    """Checkpoints after steps 1 and 2, and the trainer state each one holds."""
    g = torch.Generator().manual_seed(0)
    states = {}
    with Trainer(SPEC, POL, TrainerConfig(seed=3)) as tr:
        for step in (1, 2):
            tr.step(torch.randint(0, SPEC.vocab, (POL.batch, POL.seq), generator=g))
            ckpt_mod.save_checkpoint(tmp_path, tr, step, {"at": step})
            states[step] = _state(tr)
    return tmp_path, states


def _flip(path, where):
    data = bytearray(path.read_bytes())
    i = {"middle": len(data) // 2, "end": len(data) - 1, "header": 12}[where]
    data[i] ^= 0x10
    path.write_bytes(bytes(data))


DAMAGE = {
    # name: (file damaged, what to do, words the error must contain)
    "state byte flipped": ("state.safetensors", lambda p: _flip(p, "middle"), "checksum mismatch"),
    "state last byte flipped": ("state.safetensors", lambda p: _flip(p, "end"), "checksum mismatch"),
    "state header corrupted": ("state.safetensors", lambda p: _flip(p, "header"), "state.safetensors"),
    "state truncated": ("state.safetensors", lambda p: os.truncate(p, p.stat().st_size * 2 // 3), "truncated"),
    "state deleted": ("state.safetensors", os.unlink, "missing"),
    "metadata byte flipped": ("trainer.json", lambda p: _flip(p, "middle"), "checksum mismatch"),
    "metadata deleted": ("trainer.json", os.unlink, "missing"),
    "checksums deleted": ("SHA256SUMS", os.unlink, "missing"),
    "checksums emptied": ("SHA256SUMS", lambda p: p.write_text(""), "no checksum for"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_latest_checkpoint_is_named_and_the_previous_one_loads(two_checkpoints, damage):
    root, states = two_checkpoints
    fname, do, words = DAMAGE[damage]
    target = root / "step-00000002" / fname
    do(target)
    # the folder itself: a clear error naming the file
    with pytest.raises(CheckpointError, match=words) as e:
        ckpt_mod.verify_checkpoint(root / "step-00000002")
    assert str(root / "step-00000002") in str(e.value)
    with Trainer(SPEC, POL, TrainerConfig(seed=9)) as tr:
        with pytest.raises(CheckpointError) as e:
            ckpt_mod.load_checkpoint(root / "step-00000002", tr)
        assert str(target) in str(e.value) or str(root / "step-00000002" / "SHA256SUMS") in str(e.value)
        # the ckpt_dir: falls back to step 1, with a warning naming what was wrong
        warnings = []
        meta = ckpt_mod.load_checkpoint(root, tr, warn=warnings.append)
        assert meta["step"] == 1 and meta["loop"] == {"at": 1} and meta["path"] == str(root / "step-00000001")
        assert warnings[0].startswith("warning: skipping checkpoint step-00000002: ") and "trying step-00000001" in warnings[0]
        assert "resumed from step-00000001, an older checkpoint than the latest" in warnings[-1]
        assert _equal(_state(tr), states[1]) and tr.state_invalid is None and tr.pending
        tr.step(torch.randint(0, SPEC.vocab, (POL.batch, POL.seq)))  # and it trains on


def test_an_intact_latest_checkpoint_loads_with_no_warning(two_checkpoints):
    root, states = two_checkpoints
    with Trainer(SPEC, POL, TrainerConfig(seed=9)) as tr:
        meta = ckpt_mod.load_checkpoint(root, tr, warn=pytest.fail)
        assert meta["step"] == 2 and _equal(_state(tr), states[2])


def test_corruption_found_after_the_store_was_written_invalidates_the_trainer(two_checkpoints):
    """The state is verified in the same pass that reads it: a bad last byte is only known once
    the store holds the damaged data, so the trainer refuses to step until a load succeeds."""
    root, states = two_checkpoints
    _flip(root / "step-00000002" / "state.safetensors", "end")
    with Trainer(SPEC, POL, TrainerConfig(seed=9)) as tr:
        with pytest.raises(CheckpointError, match="checksum mismatch"):
            ckpt_mod.load_checkpoint(root / "step-00000002", tr)
        assert tr.state_invalid
        with pytest.raises(ExecError, match="state is invalid.*load a checkpoint"):
            tr.step(torch.randint(0, SPEC.vocab, (POL.batch, POL.seq)))
        ckpt_mod.load_checkpoint(root / "step-00000001", tr)
        assert tr.state_invalid is None and _equal(_state(tr), states[1])


def test_every_checkpoint_damaged_is_one_clear_error(two_checkpoints):
    root, _ = two_checkpoints
    _flip(root / "step-00000001" / "state.safetensors", "middle")
    os.unlink(root / "step-00000002" / "trainer.json")
    with Trainer(SPEC, POL) as tr:
        with pytest.raises(CheckpointError, match=r"no intact checkpoint in .*step-00000002.*missing.*"
                                                  r"step-00000001.*checksum mismatch"):
            ckpt_mod.load_checkpoint(root, tr, warn=lambda *_: None)


def test_a_checkpoint_newer_than_latest_is_tried_first(two_checkpoints):
    """Killed between publishing step 2 and updating `latest`: latest still names step 1, but
    step 2 (complete, published later) is the newest and loads (issue 19 item 11); step 1 is
    the fallback if step 2 is damaged."""
    root, states = two_checkpoints
    (root / "latest").write_text("step-00000001\n")
    assert [p.name for p in ckpt_mod.candidates(root)] == ["step-00000002", "step-00000001"]
    with Trainer(SPEC, POL) as tr:
        assert ckpt_mod.load_checkpoint(root, tr, warn=pytest.fail)["step"] == 2
        _flip(root / "step-00000002" / "state.safetensors", "middle")
        assert ckpt_mod.load_checkpoint(root, tr, warn=lambda *_: None)["step"] == 1
        assert _equal(_state(tr), states[1])


def test_loop_resume_falls_back_and_continues(tmp_path):
    ds = load_dataset(None, ByteTokenizer(), seq=16, eval_fraction=0.01)

    def loop(seed):
        tr = Trainer(SPEC, POL, TrainerConfig(seed=seed))
        cfg = LoopConfig(steps=6, lr_schedule=CosineSchedule(peak=1e-3, total_steps=6), eval_batches=0,
                         ckpt_dir=str(tmp_path), save_every=2, keep_ckpts=0, progress=False)
        msgs = []
        return tr, TrainLoop(tr, ds, cfg, out=msgs.append), msgs

    tr, first, _ = loop(0)
    with tr:
        first.run(until=4)
    os.truncate(tmp_path / "step-00000004" / "state.safetensors", 100)
    tr, again, msgs = loop(1)
    with tr:
        assert again.resume(tmp_path).name == "step-00000002" and again.step == 2
        again.run()
    assert "truncated" in msgs[0] and "step-00000004" in msgs[0]
    assert again.losses[2] == first.losses[2] and again.losses[3] == first.losses[3]  # exact resume from 2
    assert ckpt_mod.latest_checkpoint(tmp_path).name == "step-00000006"
    ckpt_mod.verify_checkpoint(tmp_path / "step-00000004")  # rewritten whole by the resumed run


def test_pruning_after_a_fallback_keeps_the_resumed_trajectory(tmp_path):
    """Resumed from step 2 because step 4 was damaged: saving step 3 with keep=2 must keep
    step 2 (the intact one this run came from), not count the damaged step 4 as recent."""
    with Trainer(SPEC, POL) as tr:
        for s in (2, 4):
            ckpt_mod.save_checkpoint(tmp_path, tr, s, keep=2)
        _flip(tmp_path / "step-00000004" / "state.safetensors", "middle")
        assert ckpt_mod.load_checkpoint(tmp_path, tr, warn=lambda *_: None)["step"] == 2
        ckpt_mod.save_checkpoint(tmp_path, tr, 3, keep=2)
        assert [p.name for p in ckpt_mod.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003",
                                                                        "step-00000004"]
        ckpt_mod.save_checkpoint(tmp_path, tr, 4, keep=2)  # overwrites the damaged one
        assert [p.name for p in ckpt_mod.list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
        ckpt_mod.verify_checkpoint(tmp_path / "step-00000004")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".") and n != ".lock"]  # no hidden leftovers


def test_a_checkpoint_for_another_run_is_refused_not_skipped(two_checkpoints):
    root, _ = two_checkpoints
    with Trainer(SPEC, Policy(batch=2, seq=16, optimizer="after")) as tr:
        with pytest.raises(HorizonError, match="policy optimizer='pipelined'.*optimizer='after'"):
            ckpt_mod.load_checkpoint(root, tr, warn=pytest.fail)


# ---- values no run writes (issue 30): checksums match, the checkpoint is still damaged ---------------
def _rewrite(folder, tensors=None, meta=None):
    """Edit a step folder's state tensors (name -> fn(tensor) in place; moments are m then v, flat) and trainer.json (fn(dict)),
    then write SHA256SUMS anew, as a hand edit with matching checksums would."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from horizon_exec.checkpoints.fileio import sha256_file
    st = folder / "state.safetensors"
    if tensors:
        with safe_open(str(st), "pt") as f:
            md = f.metadata()
        sd = load_file(st)
        for name, fn in tensors.items():
            fn(sd[name])
        save_file(sd, st, metadata=md)
    if meta:
        m = json.loads((folder / "trainer.json").read_text())
        meta(m)
        (folder / "trainer.json").write_text(json.dumps(m))
    (folder / "SHA256SUMS").write_text("".join(f"{sha256_file(folder / n)}  {n}\n"
                                               for n in ("state.safetensors", "trainer.json")))


INVALID = {
    "negative second moment": ({"moments.1": lambda t: t.view(2, -1)[1, 5:6].fill_(-1.0)},
                               "tensor 'moments.1' holds a second moment of -1.0 at element 5"),
    "NaN second moment": ({"moments.head": lambda t: t.view(2, -1)[1, 0:1].fill_(float("nan"))},
                          "tensor 'moments.head' holds a second moment of nan at element 0"),
    "inf first moment": ({"moments.emb": lambda t: t.view(2, -1)[0, 7:8].fill_(float("inf"))},
                         "tensor 'moments.emb' holds a non-finite first moment inf at element 7"),
    "NaN master": ({"master.0": lambda t: t.view(-1)[3:4].fill_(float("nan"))},
                   "tensor 'master.0' holds a non-finite value nan at element 3"),
    "NaN pending gradient": ({"hgrad.2": lambda t: t.view(-1)[0:1].fill_(float("nan"))},
                             "tensor 'hgrad.2' holds a non-finite value nan"),
    "step count past the steps taken": ({"steps.2": lambda t: t.fill_(3)},
                                        "tensor 'steps.2' holds an Adam step count of 3, outside [0, 2]"),
    "fractional step count": ({"steps.emb": lambda t: t.fill_(0.5)}, "an Adam step count of 0.5"),
}


@pytest.mark.parametrize("case", INVALID)
def test_a_checkpoint_with_impossible_values_is_damaged_and_the_previous_one_loads(two_checkpoints, case):
    root, states = two_checkpoints
    edit, words = INVALID[case]
    _rewrite(root / "step-00000002", tensors=edit)
    ckpt_mod.verify_checkpoint(root / "step-00000002")   # the checksums match
    with Trainer(SPEC, POL, TrainerConfig(seed=9)) as tr:
        warnings = []
        assert ckpt_mod.load_checkpoint(root, tr, warn=warnings.append)["step"] == 1
        assert warnings[0].startswith("warning: skipping checkpoint step-00000002: ") and words in warnings[0], warnings
        assert "(corrupt checkpoint); trying step-00000001" in warnings[0]
        assert _equal(_state(tr), states[1]) and tr.state_invalid is None


def test_a_loop_step_no_run_reached_is_damaged(tmp_path):
    """trainer.json's step 10**15 with the data position of step 4 (checksums matching) gave
    'nothing to do', exit 0: the step must match the loader's position."""
    ds = load_dataset(None, ByteTokenizer(), seq=16, eval_fraction=0.01)
    cfg = LoopConfig(steps=4, lr_schedule=CosineSchedule(peak=1e-3, total_steps=4), eval_batches=0,
                     ckpt_dir=str(tmp_path), save_every=2, keep_ckpts=0, progress=False)
    with Trainer(SPEC, POL, TrainerConfig(seed=0)) as tr:
        TrainLoop(tr, ds, cfg).run()
    _rewrite(tmp_path / "step-00000004", meta=lambda m: m.update(step=10**15))
    msgs = []
    with Trainer(SPEC, POL, TrainerConfig(seed=0)) as tr:
        loop = TrainLoop(tr, ds, cfg, out=msgs.append)
        assert loop.resume(tmp_path).name == "step-00000002" and loop.step == 2
    assert "step 1000000000000000 does not match loop.data (epoch 0, pos 8): a run at step 1000000000000000 " \
           "has read epoch" in msgs[0] and "(corrupt checkpoint); trying step-00000002" in msgs[0], msgs
