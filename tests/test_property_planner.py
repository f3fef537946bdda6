"""Property-based: over random model shapes, policies and machines, the planner either returns
a result that satisfies its invariants or raises the project's own error, never another
exception. Valid inputs are drawn most of the time (so the invariants are really exercised),
and one field is corrupted some of the time."""
import math

from hypothesis import HealthCheck, given, settings, strategies as st

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import build_schedule
from horizon_sim.schedule.op import Lane, OpKind, Space
from horizon_sim.sim.simulate import simulate
from horizon_sim.sim.timeline import check_obeys_schedule
from horizon_sim.specs.hardware_presets import DEVICES, LINKS, make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

PRECISIONS = [  # (compute, grads over the link, working copy)
    dict(compute_dtype="bf16", grad_dtype="bf16", working_copy=True),
    dict(compute_dtype="bf16", grad_dtype="bf16", working_copy=False),
    dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False),
]
BAD = {  # a field and values it must refuse
    "n_layers": [0, -3, 2.5], "hidden": [0, -64], "n_kv_heads": [3, 0], "family": ["moe"],
    "vocab": [0], "batch": [0, -1], "seq": [0], "micro_batches": [0, 3], "act_ckpt_every": [0, 99],
    "slots": [1, 0], "act_ckpt_on": ["disk"], "optimizer": ["sgd"], "grad_clip": [-1.0],
    "compute_dtype": ["fp8"], "ram": ["0", "-4G", "12 potatoes"], "gpu": ["h1000"], "link": ["pcie-gen9"],
}


@st.composite
def scenario(draw):
    heads = draw(st.sampled_from([2, 4, 8]))
    m = dict(n_layers=draw(st.integers(1, 9)), n_heads=heads,
             n_kv_heads=draw(st.sampled_from([1, 2, heads])), ffn_hidden=draw(st.integers(8, 300)),
             vocab=draw(st.integers(16, 600)), tied_embeddings=draw(st.booleans()),
             qkv_bias=draw(st.booleans()), family=draw(st.sampled_from(["llama", "gpt2"])))
    m["hidden"] = heads * draw(st.sampled_from([8, 16, 32]))
    if m["family"] == "gpt2":  # multi-head attention only
        m["n_kv_heads"] = heads
    optimizer = draw(st.sampled_from(["after", "backward", "pipelined"]))
    micro = draw(st.sampled_from([1, 2]))
    p = dict(batch=micro * draw(st.integers(1, 4)), micro_batches=micro,
             seq=draw(st.sampled_from([16, 64, 256])), act_ckpt_every=draw(st.integers(1, m["n_layers"])),
             slots=draw(st.integers(2, 4)), act_ckpt_on=draw(st.sampled_from(["device", "host"])),
             optimizer=optimizer, grad_clip=0.0 if optimizer == "backward" else draw(st.sampled_from([0.0, 1.0])),
             states_dtype=draw(st.sampled_from(["fp32", "bf16"])), **draw(st.sampled_from(PRECISIONS)))
    hw = dict(gpu=draw(st.sampled_from(sorted(DEVICES))), link=draw(st.sampled_from([None, *sorted(LINKS)])),
              ram=draw(st.sampled_from(["10GiB", "16GiB", "64GiB", "1TB"])))  # 10GiB: host short
    corrupt = draw(st.sampled_from([None] * len(BAD) + sorted(BAD)))  # half valid
    if corrupt:
        value = draw(st.sampled_from(BAD[corrupt]))
        for d in (m, p, hw):
            if corrupt in d or (d is p and corrupt in ("grad_clip",)):
                d[corrupt] = value
    return m, p, hw, corrupt


def _plan(m, p, hw):
    model, policy = ModelSpec(name="prop", **m), Policy(**p)
    hardware = make_hardware(hw["gpu"], hw["ram"], hw["link"])
    return model, policy, hardware, simulate(build_schedule(model, policy), hardware)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_planner_returns_a_sound_result_or_its_own_error(case):
    m, p, hw, corrupt = case
    try:
        model, policy, hardware, r = _plan(m, p, hw)
    except HorizonError:
        assert corrupt is not None, "a valid scenario was refused"
        return
    assert corrupt is None or corrupt == "micro_batches" and p["batch"] % 3 == 0, \
        f"bad {corrupt}={m.get(corrupt, p.get(corrupt, hw.get(corrupt)))!r} was accepted"
    sched, s = r.schedule, r.summary
    # Every op ran once, respecting dependencies and lane order.
    assert len(r.timeline) == len(sched.ops)
    check_obeys_schedule(r.timeline, sched)
    # The step is no shorter than any lane's work or the roofline.
    busy = r.timeline.groupby("lane").dur_s.sum()
    assert all(s.step_time_s >= b - 1e-12 for b in busy)
    assert s.step_time_s >= s.roofline_s * (1 - 1e-9)
    assert math.isfinite(s.tokens_per_s) and s.tokens_per_s > 0
    # Executed FLOPs never beat the achievable peak (compute time >= FLOPs / achievable peak).
    assert 0 < s.hfu <= hardware.device.matmul_efficiency + 1e-9 and s.mfu > 0
    # One optimizer update per unit per step; every dynamic device buffer is released.
    assert sum(op.kind == OpKind.OPTIMIZER for op in sched.ops) == model.n_layers + 2
    held = sched.static_bytes(Space.DEVICE) + int(hardware.device.library_workspace_MiB * 2**20)
    assert r.device_trace.bytes.iloc[-1] == held
    assert r.device_trace.bytes.min() >= held
    # Host footprint holds at least the master weights and both moments.
    bpp = {"fp32": 4, "bf16": 2}
    assert r.host.total_bytes >= model.total_params * (bpp[policy.master_dtype] + 2 * bpp[policy.states_dtype])
    # The verdict agrees with the numbers it reports.
    assert s.fits == (s.device_peak_bytes <= s.device_usable_bytes and s.host_bytes <= s.host_usable_bytes)
    assert Lane.COMPUTE.value in s.lane_busy and s.bottleneck
