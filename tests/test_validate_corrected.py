"""validate on a machine that was not quiet (validate/corrected.py): the hardware file scaled by
the drift probe's factors, both errors reported, the corrected one the headline only when the
probe's samples agree. On synthetic tables and drift figures: no wall-clock."""
from dataclasses import replace

import pandas as pd
import pytest

from horizon_exec.measure.validate.corrected import machine_moved, samples_agree, scaled_hardware
from horizon_exec.measure.validate.report import figures_text, step_headline
from horizon_exec.measure.validate.validation import Validation
from horizon_sim.specs.hardware_presets import make_hardware

QUIET = {"gemm_speed": 1.02, "gemm_samples": [1.01, 1.03], "fixed_cost_speed": 0.98, "fixed_cost_samples": [0.97, 0.99]}
FAST = {"gemm_speed": 1.35, "gemm_samples": [1.33, 1.36, 1.35], "fixed_cost_speed": 1.24,
        "fixed_cost_samples": [1.22, 1.25, 1.24]}
DRIFTING = {"gemm_speed": 1.35, "gemm_samples": [1.0, 1.35, 1.7], "fixed_cost_speed": 1.0, "fixed_cost_samples": [1.0]}


def test_moved_and_agreeing_samples():
    assert not machine_moved(QUIET) and machine_moved(FAST) and machine_moved(DRIFTING)
    assert machine_moved({"gemm_speed": None, "fixed_cost_speed": 0.9, "fixed_cost_samples": [0.9]})
    assert samples_agree(FAST) and not samples_agree(DRIFTING)


def test_scaled_hardware_runs_as_fast_as_the_probe_saw():
    hw = make_hardware("h200")
    hw = replace(hw, device=replace(hw.device, gemm_TFLOPs=(("bf16", "nn", 512.0, 512.0, 512.0, 100.0),),
                                    attention_TFLOPs=(("bf16", 1024.0, 128.0, 200.0, 150.0),),
                                    op_overhead_us=(("forward", 1000.0),), launch_overhead_us=10.0))
    s = scaled_hardware(hw, 1.25, 0.5)  # GEMMs 25% faster than calibrated, fixed costs twice as slow
    assert s.device.gemm_TFLOPs == (("bf16", "nn", 512.0, 512.0, 512.0, 125.0),)
    assert s.device.attention_TFLOPs == (("bf16", 1024.0, 128.0, 250.0, 187.5),)
    assert s.device.op_overhead_us == (("forward", 2000.0),) and s.device.launch_overhead_us == 20.0
    assert s.link == hw.link and s.host == hw.host
    assert scaled_hardware(hw, None, None) == hw


def _validation(drift, corrected=True):
    t = pd.DataFrame({"config": ["a", "b", "c"], "step_s_err": [-0.30, -0.20, 0.10],
                      "device_peak_MiB_err": [0.0] * 3, "rss_MiB_err": [0.0] * 3, "busy_compute_s_err": [0.0] * 3,
                      "overlap_err": [0.0] * 3, "device_bound_held": [True] * 3, "ranks": [1] * 3})
    if corrected:
        t["step_s_err_corrected"] = [-0.05, 0.02, 0.08]
    return Validation(make_hardware("h200"), [], t, 1.0, drift=drift)


def test_the_corrected_error_heads_only_when_the_samples_agree():
    f = _validation(FAST).figures()
    assert f["machine_moved"] and f["headline"] == "corrected"
    assert f["median_abs_step_err"] == pytest.approx(0.20) and f["headline_median_abs_step_err"] == pytest.approx(0.05)
    text = step_headline(f, FAST)
    assert text.startswith("median |step-time error| 5.0% with the drift probe's factors applied (GEMMs at 1.35x")
    assert "20.0% as measured (the machine was not quiet" in text
    f = _validation(DRIFTING).figures()
    assert f["headline"] == "measured" and f["headline_median_abs_step_err"] == pytest.approx(0.20)
    assert step_headline(f, DRIFTING).startswith("median |step-time error| 20.0% as measured; the machine was "
                                                 "not quiet and the probe's samples disagree")


def test_a_quiet_machine_reports_one_error():
    v = _validation(QUIET, corrected=False)
    f = v.figures()
    assert not f["machine_moved"] and f["median_abs_step_err_corrected"] is None and f["headline"] == "measured"
    assert figures_text(v).startswith("median |step-time error| 20.0% over 3 configurations")
