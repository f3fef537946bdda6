"""A run whose steps come out far from its plan checks the machine's speed after the run
(train/speed_recheck.py): the drift probe against the file the run was predicted on, and where
the machine moved, the same Schedule predicted again at that speed, in the closing line and the
report. The probe's own figures are timings, so the wiring tests give it fixed ones; one test
runs the real probe in fp32, the dtype a CPU without bf16 instructions trains in."""
import csv
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from horizon_exec.measure import drift as drift_mod
from horizon_exec.measure.validate.corrected import scaled_hardware
from horizon_exec.train import speed_recheck
from horizon_exec.train.plan_check import PlanCheck, Prediction
from horizon_sim.cli.main import main
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_io import save_hardware
from horizon_sim.specs.policy import Policy
from horizon_sim.specs.model_presets import model_preset
from tests.cpu_machine import CPU_HW
from tests.train_run import TINY

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

RUN = [*TINY, "--compute-dtype", "fp32", "--compute-threads", "1", "--steps", "4"]


class _FixedProbe:
    """DriftProbe with fixed figures: `speed` for GEMMs and fixed costs alike."""
    speed = 1.0

    def __init__(self, hw, configs, device="cpu", dtype="bf16"):
        self.drift = drift_mod.Drift()
        self.seen = dict(device=device, dtype=dtype, models=[c.model.name for c in configs])
        _FixedProbe.last = self

    def sample(self):
        self.drift.gemm.append(self.speed)
        self.drift.fixed.append(self.speed)

    def close(self):
        pass


@pytest.fixture
def hw(tmp_path):
    save_hardware(CPU_HW, tmp_path / "hw.toml")
    return tmp_path / "hw.toml"


def _far_off(monkeypatch):
    """Every compared step counts as far off its plan: the flat round-number file is not this
    machine, but how far off it comes out is the machine's business."""
    monkeypatch.setattr(speed_recheck, "RECHECK", 0.0)


def test_a_machine_twice_as_fast_as_its_file_is_said_and_the_step_predicted_again(tmp_path, hw, capsys, monkeypatch):
    _far_off(monkeypatch)
    monkeypatch.setattr(drift_mod, "DriftProbe", _FixedProbe)
    monkeypatch.setattr(_FixedProbe, "speed", 2.0)
    seen = {}
    from horizon_exec.cli import train_plan
    real = train_plan.plan_for

    def spy(cfg, tr, hardware, ds):
        seen["tr"] = tr
        return real(cfg, tr, hardware, ds)
    monkeypatch.setattr(train_plan, "plan_for", spy)
    rep = tmp_path / "plan"
    assert main(["train", *RUN, "--hardware", str(hw), "--report-dir", str(rep)]) == 0
    out = capsys.readouterr().out
    # the probe ran for this run's model in its compute dtype
    assert _FixedProbe.last.seen == dict(device="cpu", dtype="fp32", models=[seen["tr"].model.name])
    line = next(ln for ln in out.splitlines() if ln.startswith("plan: this machine now runs"))
    assert "GEMMs at 2.00x, per-op fixed costs at 2.00x its file's speed" in line
    table = {r["figure"]: r for r in csv.DictReader((rep / "report.csv").open())}
    again = table["step time (median), at the machine's speed after the run"]
    first = table["step time (median)"]
    assert again["measured"] == first["measured"]
    # a machine twice as fast: the same Schedule on the file scaled so, a shorter step
    fast = simulate(seen["tr"].sched, scaled_hardware(CPU_HW, 2.0, 2.0)).summary.step_time_s
    assert float(again["predicted"]) == pytest.approx(fast * 1e3, rel=1e-5)
    assert float(again["predicted"]) < float(first["predicted"])
    facts = json.loads((rep / "report.json").read_text())
    assert facts["machine_speed_after_run"]["gemm_speed"] == 2.0
    assert "probed after the run" in (rep / "report.md").read_text()


def test_a_machine_as_fast_as_its_file_leaves_the_error_to_the_cost_model(tmp_path, hw, capsys, monkeypatch):
    _far_off(monkeypatch)
    monkeypatch.setattr(drift_mod, "DriftProbe", _FixedProbe)
    monkeypatch.setattr(_FixedProbe, "speed", 1.02)  # within validate's 5%: not moved
    rep = tmp_path / "plan"
    assert main(["train", *RUN, "--hardware", str(hw), "--report-dir", str(rep)]) == 0
    out = capsys.readouterr().out
    assert "plan: this machine runs as fast as its file says (GEMMs at 1.02x" in out
    figures = [r["figure"] for r in csv.DictReader((rep / "report.csv").open())]
    assert figures == ["step time (median)", "tokens/s (median step)", "device peak (median)", "host peak RSS"]


@pytest.mark.parametrize("error, said", [(RuntimeError("no thread for the probe"), "no thread for the probe"),
                                         (ValueError("bad shape"), "ValueError: bad shape")])
def test_a_probe_that_fails_does_not_fail_the_run(tmp_path, hw, capsys, monkeypatch, error, said):
    """The weights are saved by then: whatever the probe raises is one line, and the report is
    written without the recheck."""
    _far_off(monkeypatch)

    class Broken(_FixedProbe):
        def sample(self):
            raise error
    monkeypatch.setattr(drift_mod, "DriftProbe", Broken)
    assert main(["train", *RUN, "--hardware", str(hw), "--report-dir", str(tmp_path / "plan")]) == 0
    out = capsys.readouterr().out
    assert f"plan: the machine's speed could not be probed after the run: {said}" in out
    assert "final loss" in out and (tmp_path / "plan" / "report.md").is_file()


@pytest.mark.parametrize("pred_s, meas_s, measured_speeds, wanted", [
    (1.05, 1.0, True, False),   # within RECHECK
    (1.30, 1.0, True, True),    # predicted long
    (0.70, 1.0, True, True),    # predicted short
    (1.30, 1.0, False, False),  # a quick estimate: nothing to set the machine against
])
def test_only_a_far_off_step_on_measured_speeds_is_rechecked(pred_s, meas_s, measured_speeds, wanted):
    pred = Prediction(step_s=pred_s, device_peak_bytes=1, host_rss_bytes=1, tokens_per_s=1.0, source="f")
    check = PlanCheck(pred, measured_speeds=measured_speeds, hardware=CPU_HW, repredict=lambda hw: pred)
    assert speed_recheck.wanted(check, {"step_s": meas_s}) is wanted
    assert not speed_recheck.wanted(PlanCheck(pred, measured_speeds, CPU_HW, None), {"step_s": meas_s})


def test_the_real_probe_times_the_runs_gemms_in_fp32():
    """The probe in the dtype a CPU without bf16 instructions trains in: its GEMM references
    are the file's fp32 rows (a file measured on this machine has both), timed in fp32."""
    rows = tuple(("fp32", lay, 64.0, 64.0, 64.0, 0.001) for lay in ("nt", "nn", "tn"))
    rows += tuple(("bf16", lay, 64.0, 64.0, 64.0, 0.0005) for lay in ("nt", "nn", "tn"))
    hw = replace(CPU_HW, device=replace(CPU_HW.device, gemm_TFLOPs=rows))
    run = SimpleNamespace(model=model_preset("tiny"), policy=Policy(batch=1, seq=64, compute_dtype="fp32",
                                                                     working_copy=False, master_dtype="fp32"))
    probe = drift_mod.DriftProbe(hw, [run], "cpu", dtype="fp32")
    try:
        assert probe.shapes and all(s[1:] == (64, 64, 64) for s in probe.shapes)
        # predicted at the fp32 rows' rate, not bf16's half of it
        assert probe.gemm_pred_s == pytest.approx(len(probe.shapes) * 2 * 64 ** 3 / 1e9)
        probe.sample()
    finally:
        probe.close()
    d = probe.drift.summary()
    assert d["gemm_speed"] > 0 and d["fixed_cost_speed"] > 0
