"""Non-finite steps (issue 7): a NaN/inf loss or gradient is detected; on_nonfinite='skip'
leaves every master tensor, Adam moment, step counter and working copy bit-identical (in
pipelined mode the step's pending update is dropped, not applied next step); 'stop' raises a
clear error naming the step; optimizer='backward' cannot skip exactly and only stops."""
import json
import math

import pytest
import torch

from horizon_exec.data.data import load_dataset
from horizon_exec.model.layout import unit_name
from horizon_exec.train.loop import LoopConfig, TrainLoop
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.runtime.config import OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import NonFiniteError, Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Holds, OpKind
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy, exact_policy

SPEC = ModelSpec(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256)
POLICIES = {
    "after-fp32": exact_policy(batch=2, seq=16, optimizer="after", grad_clip=1.0),
    "pipelined-fp32-accum": exact_policy(batch=4, seq=16, micro_batches=2, optimizer="pipelined", grad_clip=0.5),
    "pipelined-bf16": Policy(batch=2, seq=16, optimizer="pipelined"),
    "after-bf16-noclip": Policy(batch=2, seq=16, optimizer="after", grad_clip=0.0),
}


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _batches(pol, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, SPEC.vocab, (pol.batch, pol.seq), generator=g) for _ in range(n)]


def _state(tr) -> dict:
    """Every number an update touches, as raw bits (so NaN compares equal to itself)."""
    out = {n: t.detach().clone().view(torch.uint8) for n, t in tr.store.t.items()
           if n.startswith(("master.", "moments.", "wc."))}
    out.update({f"steps.{unit_name(tr.model, u)}": s.clone() for u, s in tr.store.steps.items()})
    return out


def _same(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [n for n in a if not torch.equal(a[n], b[n])]


def _nan_grad(tr, layer=1):
    """Hook: the device gradient of `layer` (last micro-batch) becomes NaN before it is offloaded."""
    last = tr.policy.micro_batches - 1

    def hook(op):
        if op.kind == OpKind.OFFLOAD_GRADS and op.unit == layer and op.micro == last:
            tr.buffers.find(Holds.DEVICE_GRAD, unit=layer, micro=last).fill_(math.nan)
    return hook


def _nan_loss(tr):
    """Hook: the activations entering the head become NaN: the loss and every gradient are NaN."""
    L = tr.model.n_layers

    def hook(op):
        if op.kind == OpKind.HEAD and op.micro == 0:
            tr.buffers.find(Holds.ACTIVATION, micro=0, layer=L).fill_(math.nan)
    return hook


@pytest.mark.parametrize("inject", ["grad", "loss"])
@pytest.mark.parametrize("name", POLICIES)
def test_skip_leaves_the_state_bit_identical(name, inject):
    pol = POLICIES[name]
    good = _batches(pol, 3)
    with Trainer(SPEC, pol, TrainerConfig(optimizer=OptimizerConfig(lr=1e-2))) as tr:
        assert tr.on_nonfinite == "skip"
        for t in good[:2]:
            assert not tr.step(t).skipped
        tr.flush()  # pipelined: apply step 2's update now, so nothing is pending
        before = _state(tr)
        tr.engine.hook = _nan_grad(tr) if inject == "grad" else _nan_loss(tr)
        res = tr.step(good[2])
        tr.engine.hook = None
        assert res.skipped and tr.skipped_steps == 1 and not tr.pending
        assert "grad norm nan" in res.nonfinite and (inject == "grad") != ("loss nan" in res.nonfinite)
        tr.flush()
        assert _same(before, _state(tr)) == []
        # the trainer goes on training normally
        res = tr.step(good[0])
        assert not res.skipped and math.isfinite(res.loss)
        tr.flush()
        assert len(_same(before, _state(tr))) == len(before)


@pytest.mark.parametrize("name", ["after-fp32", "pipelined-fp32-accum", "pipelined-bf16"])
def test_a_skipped_step_is_as_if_it_never_ran(name):
    """good, good, BAD, good then flush == good, good, good then flush, bit for bit (pipelined:
    the bad step still applies the previous step's pending update, and drops its own)."""
    pol = POLICIES[name]
    g0, g1, g2, bad = _batches(pol, 4)
    cfg = TrainerConfig(optimizer=OptimizerConfig(lr=1e-2))
    with Trainer(SPEC, pol, cfg) as a, Trainer(SPEC, pol, cfg) as b:
        la = [a.step(g0).loss, a.step(g1).loss]
        a.engine.hook = _nan_grad(a, layer=2)
        assert a.step(bad).skipped
        a.engine.hook = None
        la.append(a.step(g2).loss)
        lb = [b.step(g).loss for g in (g0, g1, g2)]
        a.flush()
        b.flush()
        assert la == lb
        assert _same(_state(a), _state(b)) == []


@pytest.mark.parametrize("name", ["after-fp32", "pipelined-bf16"])
def test_stop_raises_naming_the_step_and_changes_nothing(name):
    pol = POLICIES[name]
    good = _batches(pol, 3)
    with Trainer(SPEC, pol, TrainerConfig(runtime=RuntimeConfig(on_nonfinite="stop"))) as tr:
        tr.step(good[0])
        tr.step(good[1])
        tr.flush()
        before = _state(tr)
        tr.engine.hook = _nan_loss(tr)
        with pytest.raises(NonFiniteError, match=r"^step 3: non-finite loss nan and grad norm nan") as e:
            tr.step(good[2])
        assert e.value.step == 3 and "weights and optimizer state are those after step 2" in str(e.value)
        tr.flush()
        assert _same(before, _state(tr)) == []


def test_backward_mode_refuses_skip_and_stops_before_a_nonfinite_unit():
    """optimizer='backward' updates each unit as its gradient lands, before the global norm:
    'skip' cannot be exact there and is refused; the default 'stop' applies no non-finite
    gradient, leaves the unit that has one and every later one untouched, and says how many
    units were already updated."""
    pol = exact_policy(batch=2, seq=16, optimizer="backward", grad_clip=0.0)
    with pytest.raises(HorizonError, match="on_nonfinite='skip' cannot be exact with optimizer='backward'"):
        Trainer(SPEC, pol, TrainerConfig(runtime=RuntimeConfig(on_nonfinite="skip")))
    good = _batches(pol, 2)
    with Trainer(SPEC, pol) as tr:
        assert tr.on_nonfinite == "stop"
        tr.step(good[0])
        before = _state(tr)
        tr.engine.hook = _nan_grad(tr, layer=1)
        order = [o.unit for o in tr.sched.ops if o.kind == OpKind.OPTIMIZER]  # CPU lane order
        done = order[:order.index(1)]                     # units updated before layer 1's gradient
        with pytest.raises(NonFiniteError, match=f"already applied this step's finite gradients to "
                                                 f"{len(done)} of {len(order)} units") as e:
            tr.step(good[1])
        assert "step 2: non-finite gradient of unit 1 (squared norm nan)" in str(e.value)
        after = _state(tr)
        changed = {n.split(".", 1)[1] for n in _same(before, after)}
        names = {u: ("emb" if u == -1 else "head" if u == SPEC.n_layers else str(u)) for u in order}
        assert changed == {names[u] for u in done}
        assert all(torch.isfinite(t.view(torch.float32)).all() for n, t in after.items()
                   if n.startswith(("master.", "moments.")))


def test_the_loop_logs_skipped_steps(tmp_path):
    ds = load_dataset(None, ByteTokenizer(), seq=16, eval_fraction=0.01)
    pol = POLICIES["pipelined-bf16"]
    msgs = []
    with Trainer(SPEC, pol) as tr:
        cfg = LoopConfig(steps=4, lr_schedule=CosineSchedule(peak=1e-3, total_steps=4), eval_batches=0,
                         progress=False, log_file=str(tmp_path / "log.jsonl"))
        loop = TrainLoop(tr, ds, cfg, out=msgs.append)
        loop.run(until=1)
        tr.engine.hook = _nan_grad(tr)
        loop.run(until=2)
        tr.engine.hook = None
        loop.run()
    assert loop.skipped == [2] and tr.skipped_steps == 1
    recs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r.get("skipped")] == [2]
    assert recs[1]["nonfinite"].startswith("grad norm nan")
    assert any(m.startswith("step 2: non-finite grad norm nan") and "update skipped" in m for m in msgs)


def test_horizon_train_on_nonfinite_stop_exits_1(capsys, monkeypatch):
    """An update that blows the weights up (as --lr 1e30 did before it was refused): step 2 is
    non-finite."""
    from horizon_exec.optim.adamw import AdamW
    from horizon_sim.cli.main import main
    real = AdamW.step

    def blows_up(self, param, *a, working_copy=None, **kw):
        real(self, param, *a, working_copy=working_copy, **kw)
        param.mul_(1e30).mul_(1e30)
        if working_copy is not None:
            working_copy.copy_(param)

    monkeypatch.setattr(AdamW, "step", blows_up)
    argv = ["train", "--model", "tiny", "--steps", "3", "--batch", "2", "--seq", "16",
            "--no-progress", "--eval-batches", "0", "--optimizer", "after", "--grad-clip", "0",
            "--master-dtype", "fp32"]  # AdamW.step: where the CPU has bf16, the default is a split master
    assert main(argv + ["--on-nonfinite", "stop"]) == 1
    err = capsys.readouterr().err
    assert "horizon train: stopped: step 2: non-finite" in err and "on_nonfinite='stop'" in err
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 step(s) skipped for a non-finite loss or gradient: 2, 3" in out
