"""Checkpoints through a state protocol (issue 43, item 9): the Trainer declares what a
checkpoint of it holds (state_items(): tensors by name, with what they hold, and the metadata)
and takes back what a load read (load_state_items()), as torch.distributed.checkpoint's
Stateful; checkpoints/ckpt.py writes and reads only that. So any object with the two methods
round-trips, and a load whose file lacks a declared item (or holds one not declared, or one of
another shape) is refused in one line naming it."""
import json

import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.checkpoints.ckpt import CheckpointError
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.state_items import StateItems, StateTensor
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule.op import Holds
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

SPEC = ModelSpec(n_layers=2, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=128)
POL = Policy(batch=2, seq=16, optimizer="pipelined")


class Stateful:
    """Only the protocol: no store, schedule, optimizer or flags for ckpt.py to reach into."""
    __slots__ = ("tensors", "state", "invalid")

    def __init__(self, tensors: dict, steps_done: int = 3):
        self.tensors = tensors
        self.state = {"steps_done": steps_done, "pending": False, "pending_lr": 1e-3, "lr": 1e-3, "skipped_steps": 0}
        self.invalid = None

    def state_items(self, *, pending=None) -> StateItems:
        meta = {"trainer": dict(self.state), "model": SPEC.to_dict(), "policy": POL.to_dict(),
                "optimizer": {"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
                "layout": {"devices_per_node": 1, "nodes": 1, "node": 0}}
        return StateItems({n: StateTensor(t, None if n.startswith("steps.") else Holds.MASTER)
                           for n, t in self.tensors.items()}, meta)

    def load_state_items(self, state: dict, read) -> None:
        read(self.state_items(pending=state["pending"]), lambda why: setattr(self, "invalid", why))
        self.state, self.invalid = dict(state), None   # read through: valid again


def _tensors(seed: int, extra: dict | None = None) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"master.a": torch.randn(5, generator=g), "master.b": torch.randn(2, 3, generator=g),
            "steps.a": torch.tensor(float(seed % 3)), **(extra or {})}


def test_an_object_with_only_the_protocol_round_trips(tmp_path):
    src = Stateful(_tensors(1), steps_done=3)
    folder = ckpt_mod.save_checkpoint(tmp_path, src, 3, {"x": 1})
    meta = json.loads((folder / "trainer.json").read_text())
    assert meta["trainer"] == src.state and meta["loop"] == {"x": 1} and meta["step"] == 3
    assert ckpt_mod.checkpoint_bytes(src) == sum(t.numel() * 4 for t in src.tensors.values()) + (1 << 20)
    dst = Stateful(_tensors(2), steps_done=0)
    got = ckpt_mod.load_checkpoint(tmp_path, dst)
    assert got["step"] == 3 and dst.state == src.state and dst.invalid is None
    for n, t in src.tensors.items():
        assert torch.equal(dst.tensors[n], t), n


@pytest.mark.parametrize("declared,words", [
    (lambda t: {**t, "master.c": torch.zeros(4)}, "tensor 'master.c' is missing"),
    (lambda t: {k: v for k, v in t.items() if k != "master.b"}, "unexpected tensor 'master.b'"),
    (lambda t: {**t, "master.b": torch.zeros(3, 2)}, "tensor 'master.b' is [2, 3] 'F32', the store has [3, 2] F32"),
    (lambda t: {**t, "master.b": torch.zeros(2, 3, dtype=torch.bfloat16)}, "tensor 'master.b' is [2, 3] 'F32'"),
])
def test_a_checkpoint_that_does_not_hold_what_is_declared_is_refused_naming_the_item(tmp_path, declared, words):
    ckpt_mod.save_checkpoint(tmp_path, Stateful(_tensors(1)), 3)
    dst = Stateful(declared(_tensors(2)))
    before = {n: t.clone() for n, t in dst.tensors.items()}
    with pytest.raises(CheckpointError) as e:
        ckpt_mod.load_checkpoint(tmp_path / "step-00000003", dst)
    msg = str(e.value)
    assert words in msg and "\n" not in msg, msg
    assert dst.invalid is None and all(torch.equal(dst.tensors[n], t) for n, t in before.items())  # nothing read


def test_the_trainer_declares_what_its_checkpoint_holds(tmp_path):
    """The real Trainer: the declared names are the state file's, the pending gradients only
    while an update is pending; the metadata is what trainer.json records."""
    from safetensors import safe_open
    with Trainer(SPEC, POL, TrainerConfig(optimizer=OptimizerConfig(lr=1e-3), seed=0)) as tr:
        tr.step(torch.randint(0, SPEC.vocab, (2, 16), generator=torch.Generator().manual_seed(0)))
        pending, flushed = tr.state_items(), tr.state_items(pending=False)
        assert set(flushed.tensors) < set(pending.tensors)
        grads = set(pending.tensors) - set(flushed.tensors)
        assert {pending.tensors[n].holds for n in grads} == {Holds.HOST_GRAD}
        folder = ckpt_mod.save_checkpoint(tmp_path, tr, 1)
        with safe_open(str(folder / "state.safetensors"), framework="pt") as f:
            assert set(f.keys()) == set(pending.tensors)
        meta = json.loads((folder / "trainer.json").read_text())
        assert {k: meta[k] for k in pending.meta} == json.loads(json.dumps(pending.meta))
        assert meta["trainer"]["pending"] is True


def test_a_trainer_checkpoint_lacking_a_declared_item_is_refused_naming_it(tmp_path):
    """trainer.json says a pipelined update is pending, the state file holds no gradients (a
    checkpoint of another build): the first declared gradient is named, nothing is loaded."""
    with Trainer(SPEC, POL, TrainerConfig(seed=0)) as tr:
        tr.step(torch.randint(0, SPEC.vocab, (2, 16), generator=torch.Generator().manual_seed(0)))
        tr.flush()
        folder = ckpt_mod.save_checkpoint(tmp_path, tr, 1)
        grads = sorted(set(tr.state_items(pending=True).tensors) - set(tr.state_items(pending=False).tensors))
    meta = json.loads((folder / "trainer.json").read_text())
    meta["trainer"]["pending"] = True
    (folder / "trainer.json").write_text(json.dumps(meta))
    with Trainer(SPEC, POL, TrainerConfig(seed=1)) as tr:
        with pytest.raises(CheckpointError, match=f"tensor '{grads[0]}' is missing") as e:
            ckpt_mod.load_checkpoint(folder, tr, verify=False)
        assert "\n" not in str(e.value)
        tr.step(torch.randint(0, SPEC.vocab, (2, 16)))   # refused before a byte was read: still usable
