"""The math libraries' device workspaces (DeviceSpec.library_workspace_MiB): held under every
op of the step, so the planner's device peak and bound carry them, and nothing else moves.
(An H200 measured 64 MiB of them in every device peak: the tiny validation configurations'
peaks came out 97% under the measurement before.)"""
from dataclasses import replace

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_io import hardware_from_dict, hardware_to_toml
from horizon_sim.specs.hardware_presets import DEVICES, make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import MiB

SPEC = ModelSpec(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=512, vocab=512)
POL = Policy(batch=2, seq=128, act_ckpt_every=2)


def test_every_gpu_preset_holds_a_workspace_hopper_the_measured_one():
    assert all(d.library_workspace_MiB > 0 for d in DEVICES.values())
    assert DEVICES["h200"].library_workspace_MiB == DEVICES["h100-sxm"].library_workspace_MiB == 64.0


def test_the_workspace_adds_to_the_device_peak_and_bound_only():
    hw = make_hardware("h200", ram="512GB")
    bare = replace(hw, device=replace(hw.device, library_workspace_MiB=0.0))
    sched = build_schedule(SPEC, POL)
    a, b = simulate(sched, hw).summary, simulate(sched, bare).summary
    assert a.device_typical_peak_bytes - b.device_typical_peak_bytes == 64 * MiB
    assert a.device_peak_bytes - b.device_peak_bytes == 64 * MiB
    assert a.step_time_s == b.step_time_s and a.host_bytes == b.host_bytes


def test_the_hardware_file_keeps_it_and_refuses_a_negative_one():
    import tomllib
    hw = make_hardware("a100-80gb", ram="256GB")
    back = hardware_from_dict(tomllib.loads(hardware_to_toml(hw)))
    assert back.device.library_workspace_MiB == hw.device.library_workspace_MiB == 16.25
    data = tomllib.loads(hardware_to_toml(hw))
    data["device"]["library_workspace_MiB"] = -1.0
    with pytest.raises(HorizonError, match="library_workspace_MiB"):
        hardware_from_dict(data)
