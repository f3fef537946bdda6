"""Eval runs through the engine (issue 15): build_eval_schedule's forward-only Schedule over the
buffers the training step holds.

- The planner: every buffer the eval names is the training step's, declared the same way; the
  eval's device bound never exceeds the step's; it simulates like a step.
- The executor: the eval loss is the loss the next training step reports on the same batch
  (same weights, fp32), rows beyond a whole batch are padded without changing the sum, the
  measured device peak stays under the eval's planned bound and the step's measured peak, and
  HEAD_LOSS's measured temporaries under its declared workspace.
"""
import itertools

import pytest
import torch

from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import OpKind, build_eval_schedule, build_schedule
from horizon_sim.sim.device_bound import device_peak_bound
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

SPEC = ModelSpec(n_layers=3, hidden=128, n_heads=2, n_kv_heads=1, ffn_hidden=352, vocab=512)
FP32 = dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False)

POLICIES = [Policy(batch=b, seq=64, micro_batches=mb, act_ckpt_every=k, slots=s, act_ckpt_on=on, optimizer=o,
                   doc_masks=d)
            for b, mb, k, s, on, o, d in itertools.product(
                (2, 4), (1, 2), (1, 3), (2, 3), ("device", "host"), ("after", "pipelined"), (False, True))]


@pytest.mark.parametrize("policy", POLICIES[::3], ids=lambda p: f"b{p.batch}m{p.micro_batches}K{p.act_ckpt_every}"
                         f"s{p.slots}{p.act_ckpt_on}{p.optimizer}{'D' if p.doc_masks else ''}")
def test_the_eval_schedule_is_within_the_step(policy):
    for spec in (SPEC, ModelSpec(**{**SPEC.to_dict(), "tied_embeddings": True})):
        step, ev = build_schedule(spec, policy), build_eval_schedule(spec, policy)
        assert ev.meta.purpose == "eval" and step.meta.purpose == "train"
        assert all(step.buffers.get(n) == b for n, b in ev.buffers.items())
        kinds = {o.kind for o in ev.ops}
        assert kinds == {OpKind.EMBED_FWD, OpKind.LOAD_INPUT, OpKind.LOAD_WEIGHTS, OpKind.FORWARD, OpKind.HEAD_LOSS}
        assert sum(o.kind == OpKind.HEAD_LOSS for o in ev.ops) == policy.micro_batches
        assert sum(o.kind == OpKind.FORWARD for o in ev.ops) == policy.micro_batches * spec.n_layers
        assert 0 < device_peak_bound(ev) <= device_peak_bound(step)


def test_the_eval_simulates_in_a_third_of_the_compute():
    hw = make_hardware("h100-pcie", ram="512GiB")
    pol = Policy(batch=4, seq=64)
    step = simulate(build_schedule(SPEC, pol), hw)
    ev = simulate(build_eval_schedule(SPEC, pol), hw)
    tl = ev.timeline
    for op in ev.schedule.ops:  # the simulated eval obeys its dependencies
        row = tl[tl.op_id == op.id].iloc[0]
        for d in op.deps:
            assert tl[tl.op_id == d].end_s.iloc[0] <= row.start_s + 1e-12
    assert ev.summary.step_time_s < step.summary.step_time_s
    assert ev.schedule.meta.model_flops == pytest.approx(step.schedule.meta.model_flops / 3)


def _tokens(rows, seq=64, seed=0):
    return torch.randint(0, SPEC.vocab, (rows, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("optimizer", ["after", "pipelined"])
def test_eval_loss_is_the_next_steps_loss(optimizer):
    pol = Policy(batch=4, seq=64, micro_batches=2, optimizer=optimizer, **FP32)
    cfg = TrainerConfig(optimizer=OptimizerConfig(lr=1e-2), admission=AdmissionConfig(enabled=False))
    with Trainer(SPEC, pol, cfg) as tr:
        tr.step(_tokens(4, seed=1))                      # weights move (pipelined: one update pending)
        before = {k: v.clone() for k, v in tr.state_dict().items()}
        x = _tokens(4, seed=2)
        total, n = tr.eval_loss(x)
        after_eval = {k: v.clone() for k, v in tr.state_dict().items()}
        step = tr.step(x)                                # its loss is taken before its own update
    assert n == step.labelled_tokens == 4 * 63
    assert total / n == pytest.approx(step.loss, rel=1e-6)
    if optimizer == "after":  # nothing pending: the eval changed no weight
        assert all(torch.equal(before[k], after_eval[k]) for k in before)


def test_rows_beyond_whole_batches_are_padded_without_changing_the_sum():
    pol = Policy(batch=4, seq=64, micro_batches=2, **FP32)
    x = _tokens(6, seed=3)
    with Trainer(SPEC, pol, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        r = tr.evaluate(x)
        singles = [tr.eval_loss(x[i:i + 1]) for i in range(6)]  # each run is 1 row + 3 padding rows
    assert r.batches == 2 and r.labelled_tokens == 6 * 63
    assert r.loss_sum == pytest.approx(sum(s for s, _ in singles), rel=1e-6)
    assert sum(n for _, n in singles) == r.labelled_tokens


@pytest.mark.parametrize("kw", [dict(batch=4, micro_batches=2, loss_chunk_tokens=32),
                                dict(batch=2, micro_batches=1, slots=3, act_ckpt_on="host"),
                                dict(batch=2, micro_batches=2, doc_masks=True)])
def test_measured_eval_memory_is_within_its_plan_and_the_step(kw):
    spec = ModelSpec(n_layers=3, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=688, vocab=8192)
    pol = Policy(seq=128, **kw)
    x = torch.randint(0, spec.vocab, (pol.batch, pol.seq), generator=torch.Generator().manual_seed(0))
    with Trainer(spec, pol, TrainerConfig(admission=AdmissionConfig(enabled=False))) as tr:
        step = tr.step(x)
        r = tr.evaluate(x)
        ev = tr.eval_schedule
    assert r.device_peak_bytes <= device_peak_bound(ev)
    assert r.device_peak_bytes <= step.device_peak_bytes
    heads = r.timeline[r.timeline.kind == OpKind.HEAD_LOSS.value]
    planned = {o.id: o.workspace_bytes for o in ev.ops if o.kind == OpKind.HEAD_LOSS}
    assert len(heads) == pol.micro_batches
    for row in heads.itertuples():
        assert planned[row.op_id] / 2 <= row.temp_peak_bytes <= planned[row.op_id]  # a bound, not a loose one
    for op in ev.ops:  # the measured eval obeys its dependencies
        row = r.timeline[r.timeline.op_id == op.id].iloc[0]
        for d in op.deps:
            assert r.timeline[r.timeline.op_id == d].end_s.iloc[0] <= row.start_s
