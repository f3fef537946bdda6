"""Schedule families as plug-ins: one registry (plan/families.py) names each family's builder,
policy and planner; the builders share StepBuilder; the meta says which family built a Schedule,
and the executor refuses a family it does not run, by name."""
import json

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.plan.families import FAMILIES, family, peer
from horizon_sim.schedule import ScheduleError
from horizon_sim.schedule.op import PEERS, Family
from horizon_sim.schedule.serialize import from_json, to_json
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.layout import Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=160, vocab=512)
POLICY = Policy(batch=2, seq=32)


def test_every_family_is_registered_and_the_peers_are_the_others():
    assert set(FAMILIES) == set(Family)
    assert set(PEERS) == {f.value for f in Family} - {"horizon"}


@pytest.mark.parametrize("name", [f.value for f in Family])
def test_a_family_builds_and_plans_its_own_schedule(name):
    fam = family(name)
    pol = fam.like(POLICY)
    assert isinstance(pol, fam.policy_type) and (pol.batch, pol.seq) == (POLICY.batch, POLICY.seq)
    sched = fam.build(SPEC, pol)
    assert sched.meta.family is fam.name and sched.meta.model is SPEC
    r = fam.plan(SPEC, make_hardware("h100-pcie", "64GiB"), pol)
    assert r.schedule.meta.family is fam.name and r.summary.step_time_s > 0
    assert from_json(to_json(sched)).meta.family is fam.name  # typed through the file too


def test_knobs_are_the_policy_fields_and_like_applies_them():
    zero3 = peer("zero3-offload")
    assert "act_ckpt" in zero3.knobs and "reduce_bucket_params" in zero3.knobs
    assert zero3.like(POLICY, act_ckpt=False).act_ckpt is False
    assert family("horizon").like(POLICY, micro_batches=2).micro_batches == 2


def test_unknown_names_are_one_line_errors():
    with pytest.raises(HorizonError, match=r"^unknown schedule family 'zero3' \(did you mean 'zero3-offload'\?\); "
                                           r"known: horizon, zero3-offload, zero2-offload$"):
        family("zero3")
    with pytest.raises(HorizonError, match=r"^unknown peer 'horizon'; allowed: zero3-offload, zero2-offload$"):
        peer("horizon")
    doc = json.loads(to_json(family("horizon").build(SPEC, POLICY)))
    doc["meta"]["family"] = "megatron"
    with pytest.raises(ScheduleError, match="family 'megatron' is unknown; known: horizon, zero3-offload, zero2-offload"):
        from_json(json.dumps(doc))


def test_a_one_device_family_refuses_a_layout():
    zero3 = peer("zero3-offload")
    with pytest.raises(HorizonError, match=r"modelled on one device, not 1 node\(s\) x 2 device\(s\)"):
        zero3.build(SPEC, zero3.like(POLICY), Layout(2))


def test_the_executor_refuses_a_family_it_does_not_run_by_name():
    pytest.importorskip("torch")
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    zero3 = peer("zero3-offload")
    sched = zero3.build(SPEC, zero3.like(POLICY))
    with pytest.raises(HorizonError, match=r"the schedule is a zero3-offload step; the executor runs Horizon's "
                                           r"\(a zero3-offload step is run by DeepSpeed itself, as horizon validate --peer "
                                           r"zero3-offload does\)"):
        Trainer(SPEC, sched.meta.policy, TrainerConfig(admission=AdmissionConfig(enabled=False)), schedule=sched)
