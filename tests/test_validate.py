"""`horizon validate`: the quick configurations run, the table has every comparison with finite
errors, the report files and the predicted-vs-measured overlays are written, and the metrics
behind the table are right on timelines worked by hand. No wall-clock assertions."""
import json
import math

import pandas as pd
import pytest

from horizon_exec.measure.validate import QUICK_CONFIGS, timeline_metrics
from horizon_sim.cli.main import main
from horizon_sim.report.overlay import plot_overlay
from horizon_sim.specs.hardware_io import save_hardware
from tests.cpu_machine import CPU_HW

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("val")
    save_hardware(CPU_HW, root / "hw.toml")
    return root  # reports/ is not made here: validate creates its --out folder


def test_validate_quick_writes_table_overlays_and_json(run, capsys):
    out = run / "reports"
    assert main(["validate", "--quick", "--hardware", str(run / "hw.toml"), "--out", str(out),
                 "--steps", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    names = [c.name for c in QUICK_CONFIGS]
    assert [c["config"] for c in res["configs"]] == names
    for c in res["configs"]:
        for k in ("step_s_err", "device_peak_MiB_err", "rss_MiB_err", "overlap_err", "busy_compute_s_err"):
            assert c[k] is not None and math.isfinite(c[k]), (c["config"], k)
    f = res["figures"]
    assert f["configs"] == 3 and f["worst_step_config"] in names
    assert math.isfinite(f["median_abs_step_err"])
    # tiny_r2 ran as 2 ranks (one node, the store shared) and is summarised apart
    assert [c["ranks"] for c in res["configs"]] == [c.ranks for c in QUICK_CONFIGS] == [1, 1, 2]
    assert f["multi_rank_configs"] == 1 and math.isfinite(f["median_abs_step_err_multi_rank"])
    table = pd.read_csv(out / "validation.csv")
    for col in ("config", "step_s_pred", "step_s_meas", "step_s_err", "busy_compute_s_pred",
                "busy_compute_s_meas", "busy_h2d_s_err", "busy_d2h_s_err", "busy_cpu_s_err", "overlap_pred",
                "overlap_meas", "device_peak_MiB_pred", "device_peak_MiB_meas", "device_peak_MiB_err",
                "rss_MiB_pred", "rss_MiB_meas", "rss_MiB_err"):
        assert col in table.columns, col
    assert (table.step_s_meas > 0).all() and (table.device_peak_MiB_meas > 0).all()
    # no measured step exceeds the device bound whatever the timing (issue 19 item 14)
    assert f["device_bound_held"] and table.device_bound_held.all()
    assert (table.device_peak_max_MiB <= table.device_bound_MiB).all()
    assert (table.device_bound_MiB >= table.device_peak_MiB_pred).all()
    md = (out / "validation.md").read_text()
    for n in names:
        png = out / f"validation_{n}.png"
        assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"validation_{n}.png" in md
    assert "Median |step-time error|" in md and "Cost terms" in md and "Data-parallel configurations (tiny_r2" in md
    # the machine's speed was sampled before the first turn and after each (2 steps = 1 turn)
    speed = res["machine_speed"]
    assert speed["gemm_speed"] is None  # CPU_HW has no GEMM table to compare with
    assert len(speed["fixed_cost_samples"]) == 2 and 0 < speed["fixed_cost_speed"] < 100
    assert "Machine speed against the hardware file" in md


def test_drift_references_are_the_heaviest_gemms_priced_by_the_table():
    from dataclasses import replace

    from horizon_exec.measure.calibrate.kernels import model_gemms
    from horizon_exec.measure.drift import DriftProbe, reference_gemms
    shapes = reference_gemms(QUICK_CONFIGS, max_shapes=3)
    every = set().union(*(model_gemms(c.model, c.policy) for c in QUICK_CONFIGS))
    assert len(shapes) == 3 and set(shapes) <= every
    assert min(m * n * k for _, m, n, k in shapes) >= max(m * n * k for s in every - set(shapes) for _, m, n, k in [s])
    rows = tuple(("bf16", lay, float(m), float(n), float(k), 0.25) for lay, m, n, k in every)
    hw = replace(CPU_HW, device=replace(CPU_HW.device, gemm_TFLOPs=rows))
    probe = DriftProbe(hw, QUICK_CONFIGS)
    try:
        assert probe.gemm_pred_s == pytest.approx(sum(2 * m * n * k for _, m, n, k in probe.shapes) / 0.25e12)
        probe.sample()
        assert len(probe.drift.gemm) == len(probe.drift.fixed) == 1 and probe.drift.gemm[0] > 0
    finally:
        probe.close()


def test_drift_references_on_a_gpu_table_are_not_launch_bound():
    """On a GPU the quick configurations' GEMMs take a few microseconds whatever their size
    (an H200 measured them at '0.00x' the table's rate): the probe times measured shapes that
    are not launch-bound, each the measured twin of a configuration's shape (the only 'tn' row
    here stands for every 'tn' shape; the 512-cube 'nn' row is launch-bound, and no 'nt' row
    was measured), and the table's own largest shapes when none is left."""
    from dataclasses import replace

    from horizon_exec.measure.drift import MIN_CALL_S, drift_gemms
    from horizon_sim.sim.costs import CostModel
    rows = (("bf16", "nn", 512.0, 512.0, 512.0, 17.0), ("bf16", "nn", 4096.0, 4096.0, 4096.0, 800.0),
            ("bf16", "tn", 8192.0, 8192.0, 8192.0, 850.0), ("fp32", "nn", 16384.0, 16384.0, 16384.0, 50.0))
    hw = replace(CPU_HW, device=replace(CPU_HW.device, gemm_TFLOPs=rows))
    costs = CostModel(hw, "bf16")
    assert drift_gemms(hw, costs, QUICK_CONFIGS) == [("tn", 8192, 8192, 8192)]
    no_tn = replace(hw, device=replace(hw.device, gemm_TFLOPs=rows[:2] + rows[3:]))
    assert drift_gemms(no_tn, CostModel(no_tn, "bf16"), QUICK_CONFIGS) == [("nn", 4096, 4096, 4096),
                                                                           ("nn", 512, 512, 512)]
    slow = replace(hw, device=replace(hw.device, gemm_TFLOPs=tuple(r[:5] + (1e-3,) for r in rows)))
    kept = drift_gemms(slow, CostModel(slow, "bf16"), QUICK_CONFIGS)  # a slow device: nothing launch-bound
    assert {("nn", 512, 512, 512), ("tn", 8192, 8192, 8192)} <= set(kept)  # twins of the configs' nn and tn
    assert all(m <= 512 for lay, m, _, _ in kept if lay == "nt")  # no nt row measured: the configs' own
    assert all(2 * m * n * k / 1e9 >= MIN_CALL_S for _, m, n, k in kept)


@pytest.mark.parametrize("argv, says", [
    (["--out", "FILE"], "is a file, not a folder"),
    (["--steps", "0"], "--steps 0 must be >= 1"),
    (["--configs", "base,nosuch"], "unknown configuration(s) nosuch"),
    (["--hardware", "missing.toml"], "missing.toml"),
    (["--configs", "tiny_r2", "--device", "meta"], "--device"),
])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, argv, says):
    (tmp_path / "FILE").write_text("not a folder")
    argv = [str(tmp_path / a) if a in ("FILE", "missing.toml") else a for a in argv]
    base = ["validate", "--hardware", str(run / "hw.toml"), "--out", str(tmp_path / "r")]
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_multi_rank_configurations_are_refused_off_the_cpu_backend():
    from horizon_exec.measure.validate import validate
    from horizon_sim.errors import HorizonError
    with pytest.raises(HorizonError, match="tiny_r2 run several ranks.*CPU backend only, not cuda"):
        validate(CPU_HW, QUICK_CONFIGS, device="cuda", out_dir=None, say=None)


def test_node_rss_counts_the_shared_store_once():
    from horizon_exec.procfs import node_rss_bytes
    # two ranks: 500 MiB private each; the leader touched the whole 300 MiB store, rank 1 a third
    assert node_rss_bytes([800, 600], [300, 100]) == 500 + 500 + 300
    assert node_rss_bytes([800], [0]) == 800


def _tl(rows):
    df = pd.DataFrame(rows, columns=["op_id", "kind", "lane", "unit", "micro", "start_s", "end_s"])
    df["dur_s"] = df.end_s - df.start_s
    return df


def test_metrics_on_a_hand_worked_timeline(tmp_path):
    """Compute busy [0, 4) and [5, 9); a load [0, 2) overlaps it fully; an offload [3, 6)
    overlaps it in [3, 4) and [5, 6), 2 of its 3 s: overlap = (2 + 2) / (2 + 3) = 0.8."""
    tl = _tl([(0, "load_weights", "h2d", 0, 0, 0.0, 2.0), (1, "forward", "compute", 0, 0, 0.0, 4.0),
              (2, "offload_grads", "d2h", 0, 0, 3.0, 6.0), (3, "backward", "compute", 0, 0, 5.0, 9.0)])
    m = timeline_metrics(tl)
    assert m["busy_compute"] == 8.0 and m["busy_h2d"] == 2.0 and m["busy_d2h"] == 3.0 and m["busy_cpu"] == 0.0
    assert m["overlap"] == pytest.approx(0.8) and m["end_s"] == 9.0
    other = tl.assign(start_s=tl.start_s * 1.1, end_s=tl.end_s * 1.1, dur_s=tl.dur_s * 1.1)
    plot_overlay(tl, other, tmp_path / "o.png", title="hand-worked")
    assert (tmp_path / "o.png").stat().st_size > 5_000
