"""Issue 15's test of a Schedule that says everything: rename every buffer of a Schedule (names
are for display only) and both interpreters give the same results: the simulator the same
timeline and summary, the executor the same losses, gradient norms and weights, bit for bit."""
from dataclasses import replace

import pytest
import torch

from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import Schedule, build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab=128, tied_embeddings=True,
                 layer_windows=(0, 8, 0))
POLICIES = {
    "pipelined-micro-docs": Policy(batch=4, seq=16, micro_batches=2, doc_masks=True),
    "after-device-ckpts": Policy(batch=2, seq=16, act_ckpt_every=2, act_ckpt_on="device", slots=3,
                                 optimizer="after", working_copy=False),
    "backward": Policy(batch=2, seq=16, optimizer="backward", grad_clip=0.0),
}


def renamed(sched: Schedule) -> Schedule:
    """The same schedule with every buffer called b<i> (shuffled: no order to lean on either)."""
    import random
    names = list(sched.buffers)
    ids = list(range(len(names)))
    random.Random(0).shuffle(ids)
    new = {n: f"b{i}" for n, i in zip(names, ids)}
    ops = tuple(replace(o, reads=tuple(new[n] for n in o.reads), writes=tuple(new[n] for n in o.writes),
                        frees=tuple(new[n] for n in o.frees)) for o in sched.ops)
    buffers = {new[n]: replace(b, name=new[n]) for n, b in sched.buffers.items()}
    return Schedule(ops=ops, buffers=buffers, meta=sched.meta).check()


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_simulator_reads_no_name(name):
    sched = build_schedule(SPEC, POLICIES[name])
    hw = make_hardware("h100-pcie")
    a, b = simulate(sched, hw), simulate(renamed(sched), hw)
    assert a.timeline.drop(columns="label", errors="ignore").equals(b.timeline.drop(columns="label", errors="ignore"))
    assert a.summary == b.summary and a.host.by_role == b.host.by_role


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_executor_reads_no_name(name):
    pol = POLICIES[name]
    toks = [torch.randint(0, SPEC.vocab, (pol.batch, pol.seq), generator=torch.Generator().manual_seed(i))
            for i in range(2)]
    docs = torch.zeros(pol.batch, pol.seq, dtype=torch.int64)
    docs[:, 5:] = 1
    results = []
    for sched in (build_schedule(SPEC, pol), renamed(build_schedule(SPEC, pol))):
        with Trainer(SPEC, pol, TrainerConfig(admission=AdmissionConfig(enabled=False)), schedule=sched) as tr:
            out = [tr.step(t, docs=docs if pol.doc_masks else None) for t in toks]
            tr.flush()
            results.append(([(r.loss, r.grad_norm) for r in out], {k: v.clone() for k, v in tr.state_dict().items()}))
    (la, wa), (lb, wb) = results
    assert la == lb
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
