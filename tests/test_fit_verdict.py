"""One answer to "does it fit" (issue 15): plan, the sweep and the executor's admission all
decide with MemoryVerdict. On a grid of models, policies and machines: the planner's summary
and the sweep's outcome give the same verdict from the same numbers, and admission, given the
planner's usable memories as its budgets, needs the planner's roles plus its own extras, so
it never admits what the planner refuses."""
from dataclasses import replace

import pytest

from horizon_exec.runtime.admission import AdmissionError, admit
from horizon_sim.plan.runner import Runner
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.sim.verdict import MemoryVerdict
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

MODELS = [ModelSpec(name="m4", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=688, vocab=2048),
          ModelSpec(name="m8", n_layers=8, hidden=512, n_heads=8, n_kv_heads=4, ffn_hidden=1376, vocab=8192,
                    tied_embeddings=True)]
POLICIES = [Policy(batch=2, seq=256), Policy(batch=4, seq=512, act_ckpt_on="device", optimizer="after"),
            Policy(batch=4, seq=256, micro_batches=2, optimizer="backward", grad_clip=0.0)]
HOST_GIB = (1.0, 4.2, 64.0)      # short, near, plenty (the runtime alone is 4 GiB in the preset)
DEVICE_GIB = (0.05, 80.0)


def _machine(host_gib, device_gib):
    hw = make_hardware("h100-pcie")
    return replace(hw, host=replace(hw.host, ram_GiB=host_gib, os_reserved_GiB=0.0),
                   device=replace(hw.device, hbm_GiB=device_gib, reserved_GiB=0.0))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("policy", POLICIES, ids=["pipelined", "after-device", "backward-micro"])
def test_plan_sweep_and_admission_agree(model, policy):
    with Runner(workers=1) as runner:
        for host_gib in HOST_GIB:
            for device_gib in DEVICE_GIB:
                hw = _machine(host_gib, device_gib)
                sched = build_schedule(model, policy)
                s = simulate(sched, hw).summary
                assert isinstance(s.memory, MemoryVerdict) and s.fits == s.memory.fits
                out = runner.run([(model, hw, policy)])[0]
                v = out.verdict(hw)
                assert (v.fits, v.host_fits, v.device_fits) == (s.memory.fits, s.memory.host_fits,
                                                                 s.memory.device_fits)
                assert v.host_need_bytes == s.memory.host_need_bytes
                assert v.device_need_bytes == s.memory.device_need_bytes
                try:
                    adm = admit(model, policy, sched, device="cpu", host_budget_bytes=s.memory.host_usable,
                                device_budget_bytes=s.memory.device_usable, hardware=hw, advise=False)
                    admitted = adm.memory
                except AdmissionError as e:
                    admitted = e.admission.memory
                assert isinstance(admitted, MemoryVerdict)
                for role, need in s.memory.device_need.items():
                    assert admitted.device_need[role] == need, role
                assert admitted.device_need_bytes >= s.memory.device_need_bytes
                if admitted.fits:
                    assert s.fits, (model.name, policy, host_gib, device_gib)
                if not s.memory.device_fits:
                    assert not admitted.device_fits
