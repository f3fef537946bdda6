"""Issue 44 item 2: a step of any number of micro-batches is planned, with no cap on them. Past
FULL_PASSES layer passes the planner simulates a few micro-batch counts and extends the step's
figures along the line through them (horizon_sim/sim/extend.py); where both run, that is the
full simulation's answer within 1%. The old cap was 4,096 layer passes (124 micro-batches of a
32-layer model), so the comparisons go up to it."""
import json
from dataclasses import replace

import pytest

from horizon_sim.cli.main import main
from horizon_sim.job.digest import schedule_digest
from horizon_sim.job.toml import read_job
from horizon_sim.schedule import build_schedule
from horizon_sim.sim import extend
from horizon_sim.sim.extend import FULL_PASSES, extend_totals
from horizon_sim.sim.simulate import simulate_full, simulate, simulate_policy
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.layout import Layout
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy

L32 = model_preset("llama-3.1-8b")  # 32 layers: 124 micro-batches make 4,092 passes
HW = make_hardware("h100-sxm", "512GiB")


def _full(model, policy, hw):
    return simulate_full(build_schedule(model, policy, hw.cluster.layout), hw)


def _assert_close(ext, full):
    e, f = ext.summary, full.summary
    for name in ("step_time_s", "tokens_per_s", "mfu", "hfu", "device_peak_bytes", "host_bytes", "roofline_s"):
        a, b = getattr(e, name), getattr(f, name)
        assert abs(a / b - 1) <= 0.01, (name, a, b)
    exposed = sum(getattr(e, k) - getattr(f, k) for k in ("exposed_copy_s", "exposed_optimizer_s", "exposed_host_s"))
    assert abs(exposed) <= 0.01 * f.step_time_s
    if ext.extension is None or ext.extension.timeline_peak:
        assert abs(e.device_typical_peak_bytes / f.device_typical_peak_bytes - 1) <= 0.01
    else:  # not on its line at the counts simulated: the bound stands for it, never below the timeline's
        assert e.device_typical_peak_bytes == e.device_peak_bytes >= f.device_typical_peak_bytes
    assert (e.fits, e.bottleneck) == (f.fits, f.bottleneck)
    assert e.host_bytes == sum(ext.host.by_role.values())


@pytest.mark.parametrize("kw", [dict(), dict(optimizer="after", act_ckpt_every=4), dict(keep_last=4),
                                dict(mb_order="layer"), dict(mb_order="layer", act_ckpt_on="device"),
                                dict(lora_rank=16, optimizer="after"),
                                dict(lora_rank=16, optimizer="after", mb_order="layer", keep_last=4)],
                         ids=["default", "after-K4", "keep4", "layer", "layer-ckpt-device", "lora", "lora-layer-keep4"])
def test_the_extended_step_is_the_full_simulation_up_to_the_old_cap(kw):
    k = 124
    pol = Policy(batch=4 * k, micro_batches=k, seq=2048, **kw)
    ext = simulate_policy(L32, pol, HW)
    assert ext.extension is not None and max(ext.extension.simulated) < k
    assert ext.policy == pol and ext.schedule.meta.policy.micro_batches == max(ext.extension.simulated)
    _assert_close(ext, _full(L32, pol, HW))


def test_the_timeline_peak_is_extended_only_where_it_lies_on_its_line():
    """The layer order's checkpoint loads run further ahead the longer a backward phase lasts, so
    its timeline peak per micro-batch still grows at the counts that settle the rest: the plan
    says so and stands the bound in for it; the micro order's settles with the rest."""
    k = 124
    layer = simulate_policy(L32, Policy(batch=4 * k, micro_batches=k, seq=2048, mb_order="layer"), HW)
    micro = simulate_policy(L32, Policy(batch=4 * k, micro_batches=k, seq=2048), HW)
    assert not layer.extension.timeline_peak and micro.extension.timeline_peak
    from horizon_sim.cli.plan_cmd import report
    assert "timeline's own peak not extended" in report(layer) and "(this timeline " in report(micro)


def test_data_parallel_steps_extend_too():
    hw = make_hardware("h100-sxm", "512GiB", layout=Layout(2))
    model = replace(L32, n_layers=8, name="l8")
    pol = Policy(batch=2 * 200, micro_batches=200, seq=1024)  # 1,800 passes
    ext = simulate_policy(model, pol, hw)
    assert ext.extension is not None and ext.summary.ranks == 2
    _assert_close(ext, _full(model, pol, hw))


def test_simulate_of_a_built_schedule_extends_as_the_policy_does():
    """Callers holding the step's Schedule (the executor's admission) get the same figures."""
    model = replace(L32, n_layers=8, name="l8")
    pol = Policy(batch=2 * 150, micro_batches=150, seq=1024)
    sched = build_schedule(model, pol)
    a, b = simulate(sched, HW), simulate_policy(model, pol, HW)
    assert a.extension is not None and a.summary == b.summary


def test_a_step_within_full_passes_is_simulated_in_full():
    pol = Policy(batch=4 * 31, micro_batches=31, seq=2048)  # 1,023 passes
    assert 31 * 33 <= FULL_PASSES
    r = simulate_policy(L32, pol, HW)
    assert r.extension is None and r.schedule.meta.policy == pol


def test_counts_off_their_line_are_not_extended():
    model = replace(L32, n_layers=4, name="l4")
    runs = [_full(model, Policy(batch=4 * k, micro_batches=k, seq=2048), HW) for k in (2, 3, 4)]
    samples = [(k, r.totals, r.host) for k, r in zip((2, 3, 4), runs)]
    assert extend_totals(samples, 400) is not None
    bent = replace(runs[2].totals, step_s=runs[2].totals.step_s * 1.01)  # a kink at the third count
    assert extend_totals([*samples[:2], (4, bent, runs[2].host)], 400) is None
    fat = replace(runs[2].host, by_role={**runs[2].host.by_role,
                                          "staging": runs[2].host.by_role["staging"] + 2**30})
    assert extend_totals([*samples[:2], (4, runs[2].totals, fat)], 400) is None


def test_a_step_that_never_settles_is_simulated_in_full(monkeypatch):
    """Where no counts lie on a line the counts move on until they would reach the step's own,
    which is then simulated in full: the answer is never an extension off its line."""
    monkeypatch.setattr(extend, "EXTEND_REL", 0.0)
    model = replace(L32, n_layers=4, name="l4")
    pol = Policy(batch=4 * 60, micro_batches=60, seq=2048, mb_order="layer")
    r = simulate_policy(model, pol, HW, full_passes=0)
    assert r.extension is None and r.schedule.meta.policy == pol


@pytest.mark.parametrize("k", [128, 256])
def test_plan_takes_any_accumulation_count(capsys, k):
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--ram", "512GiB",
                 "--batch", str(4 * k), "--micro-batches", str(k), "--no-advice"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("FITS") and f"simulated 2, 3 and 4 of the {k} micro-batches" in out
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--ram", "512GiB",
                 "--batch", str(4 * k), "--micro-batches", str(k), "--no-advice", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["policy"]["micro_batches"] == k and got["simulated_micro_batches"] == [2, 3, 4]


def test_a_saved_job_carries_the_digest_of_the_steps_own_schedule(tmp_path, capsys):
    tiny = model_preset("tiny")
    job = tmp_path / "j.toml"
    assert main(["plan", "--model", "tiny", "--gpu", "h100-sxm", "--ram", "64GiB", "--batch", "400",
                 "--micro-batches", "200", "--seq", "128", "--no-advice", "--save-job", str(job)]) == 0
    saved = read_job(job)
    assert saved.policy.micro_batches == 200
    assert simulate_policy(tiny, saved.policy, HW).extension is not None  # the plan was extended
    assert saved.prediction.schedule_digest == schedule_digest(build_schedule(tiny, saved.policy))


@pytest.mark.parametrize("knobs", [dict(), dict(offload_param=False)], ids=["zero3-offload", "zero2-offload"])
def test_the_peers_steps_extend_as_horizons(knobs):
    """`plan --compare` at many micro-batches: DeepSpeed's step, built by the peer's builder, is
    simulated at a few counts and extended the same way, at its full simulation's answer."""
    from horizon_sim.peer.compare import peer_hardware, plan_zero3
    from horizon_sim.peer.zero3_builder import build_zero3_schedule
    from horizon_sim.peer.zero3_policy import Zero3Policy
    z = Zero3Policy(batch=4 * 124, micro_batches=124, seq=2048, **knobs)
    ext = plan_zero3(L32, HW, z)
    full = simulate_full(build_zero3_schedule(L32, z), peer_hardware(HW, z))
    assert ext.extension is not None and ext.policy.micro_batches == 124
    e, f = ext.summary, full.summary
    for name in ("step_time_s", "device_peak_bytes", "host_bytes"):
        assert abs(getattr(e, name) / getattr(f, name) - 1) <= 0.01, name
    assert (e.fits, e.bottleneck) == (f.fits, f.bottleneck)
    assert f.device_typical_peak_bytes <= e.device_typical_peak_bytes <= e.device_peak_bytes
