"""Every run checks itself against its plan (issue 39, item 3): with a hardware file the run
prints the planner's prediction of its own Schedule at start, each metrics-log line after
warm-up carries measured and predicted step time, device peak and RSS, and at the end the
predicted-vs-measured report (`horizon validate`'s table and overlay, for this run) is written
beside the checkpoints or into --report-dir. Without a hardware file: one line, no report."""
import csv
import json
import math
from types import SimpleNamespace

import pytest

from horizon_exec.cli import train_plan
from horizon_exec.train.plan_check import WARMUP_STEPS, PlanCheck, Prediction, dataset_bytes
from horizon_sim.cli.main import main
from horizon_sim.sim.process_rss import predict_rss
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware_io import save_hardware
from tests.cpu_machine import CPU_HW
from tests.train_run import TINY

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

PLAN_KEYS = ("step_s", "predicted_step_s", "device_peak_bytes", "predicted_device_peak_bytes", "rss_bytes",
             "predicted_rss_bytes")
# one compute thread: the split CPU_HW's rates are for (cores - 1), so the file is used as it is
RUN = [*TINY, "--compute-dtype", "fp32", "--compute-threads", "1", "--steps", "5"]


@pytest.fixture(autouse=True)
def _no_speed_recheck(monkeypatch):
    """The flat round-number file is always far off this machine, which would probe its speed
    after every run here: that recheck has its own tests (test_speed_recheck.py)."""
    from horizon_exec.train import speed_recheck
    monkeypatch.setattr(speed_recheck, "RECHECK", float("inf"))


@pytest.fixture
def hw(tmp_path):
    save_hardware(CPU_HW, tmp_path / "hw.toml")
    return tmp_path / "hw.toml"


def _log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_run_is_set_against_the_simulation_of_its_own_schedule(tmp_path, hw, capsys, monkeypatch):
    seen = {}
    real = train_plan.plan_for

    def spy(cfg, tr, hardware, ds):  # the trainer and data the run predicted for
        seen.update(tr=tr, ds=ds)
        return real(cfg, tr, hardware, ds)
    monkeypatch.setattr(train_plan, "plan_for", spy)
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    assert main(["train", *RUN, "--hardware", str(hw), "--ckpt-dir", str(ck), "--log-file", str(log)]) == 0
    out = capsys.readouterr().out
    sim = simulate(seen["tr"].sched, CPU_HW)
    rss = predict_rss(sim, "cpu").total_bytes + dataset_bytes(seen["ds"])
    plan = [ln for ln in out.splitlines() if ln.startswith("plan: ")]
    assert len(plan) == 1 and plan[0].endswith(f"(--hardware {hw})"), out
    assert f"plan: step {sim.summary.step_time_s * 1e3:.1f} ms" in plan[0]
    recs = _log(log)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    for r in recs[:WARMUP_STEPS]:  # warm-up: not compared
        assert not set(PLAN_KEYS) & set(r), r
    for r in recs[WARMUP_STEPS:]:
        assert all(isinstance(r[k], (int, float)) and math.isfinite(r[k]) and r[k] > 0 for k in PLAN_KEYS), r
        assert r["predicted_step_s"] == sim.summary.step_time_s
        assert r["predicted_device_peak_bytes"] == sim.summary.device_typical_peak_bytes
        assert r["predicted_rss_bytes"] == rss
    # the report beside the checkpoints: validate's table and overlay, for this run
    rep = ck / "report"
    assert sorted(p.name for p in rep.iterdir()) == ["overlay.png", "report.csv", "report.json", "report.md"]
    assert f"plan report: {rep / 'report.md'}" in out and "plan vs measured over 3 step(s)" in out
    png = (rep / "overlay.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = list(csv.DictReader((rep / "report.csv").open()))
    assert [r["figure"] for r in table] == ["step time (median)", "tokens/s (median step)", "device peak (median)",
                                            "host peak RSS"]
    assert all(math.isfinite(float(r[k])) for r in table for k in ("predicted", "measured", "error"))
    assert float(table[0]["predicted"]) == pytest.approx(sim.summary.step_time_s * 1e3, rel=1e-5)
    facts = json.loads((rep / "report.json").read_text())
    assert facts["steps_compared"] == 3 and facts["hardware"] == f"--hardware {hw}"
    md = (rep / "report.md").read_text()
    assert "| step time (median) | ms |" in md and "![overlay](overlay.png)" in md and "training data" in md


def _this_machine(monkeypatch, source, kind):
    """measure/machine's description of this machine, as the run gets it without --hardware."""
    from horizon_exec import measure
    from horizon_exec.measure.machine import MachineDescription
    monkeypatch.setattr(measure.machine, "this_machine", lambda device, hardware_path=None, say=None:
                        MachineDescription(CPU_HW, source, kind))


def test_without_hardware_the_machines_calibration_is_the_plan(tmp_path, capsys, monkeypatch):
    """On the CPU backend the prediction uses the calibration the machine has (the per-user
    cache's), and its report goes beside the checkpoints as with --hardware."""
    from horizon_exec.measure.machine import CALIBRATED
    _this_machine(monkeypatch, "calibration cached in ~/.cache/horizon/machines/cpu.toml on 2026-11-29", CALIBRATED)
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    assert main(["train", *RUN, "--ckpt-dir", str(ck), "--log-file", str(log)]) == 0
    out = capsys.readouterr().out
    plan = [ln for ln in out.splitlines() if ln.startswith("plan: ")]
    assert len(plan) == 1 and plan[0].endswith("(calibration cached in ~/.cache/horizon/machines/cpu.toml on "
                                               "2026-11-29)"), out
    assert set(PLAN_KEYS) <= set(_log(log)[-1]) and (ck / "report" / "report.md").is_file()


def test_report_dir_without_checkpoints(tmp_path, hw, capsys):
    rep = tmp_path / "runs" / "plan"
    assert main(["train", *RUN, "--steps", "3", "--hardware", str(hw), "--report-dir", str(rep)]) == 0
    assert sorted(p.name for p in rep.iterdir()) == ["overlay.png", "report.csv", "report.json", "report.md"]
    assert "plan vs measured over 1 step(s)" in capsys.readouterr().out


def test_no_report_when_no_step_is_past_warm_up(tmp_path, hw, capsys):
    rep = tmp_path / "plan"
    assert main(["train", *RUN, "--steps", str(WARMUP_STEPS), "--hardware", str(hw), "--report-dir", str(rep)]) == 0
    out = capsys.readouterr().out
    assert f"plan: no step compared ({WARMUP_STEPS} ran;" in out and "plan report" not in out
    assert list(rep.iterdir()) == []


@pytest.mark.parametrize("where, why", [(".", "is the --ckpt-dir"), ("step-00000001/r", "a checkpoint folder")])
def test_report_dir_among_the_checkpoints_is_refused(tmp_path, hw, capsys, where, why):
    ck = tmp_path / "ck"
    rc = main(["train", *RUN, "--hardware", str(hw), "--ckpt-dir", str(ck), "--report-dir", str(ck / where)])
    err = capsys.readouterr().err
    assert rc == 2 and "--report-dir" in err and why in err and len(err.strip().splitlines()) == 1, err


def test_the_default_report_folder_is_the_runs_own_in_the_ckpt_dir(tmp_path, hw, capsys):
    """A fresh run into a --ckpt-dir that holds only its report folder (a run stopped before its
    first checkpoint, say) is not refused for a foreign entry; anything else still is."""
    ck = tmp_path / "ck"
    (ck / "report").mkdir(parents=True)
    assert main(["train", *RUN, "--steps", "3", "--hardware", str(hw), "--ckpt-dir", str(ck)]) == 0
    assert (ck / "report" / "report.md").is_file()
    other = tmp_path / "ck2"
    (other / "notes").mkdir(parents=True)
    assert main(["train", *RUN, "--steps", "3", "--hardware", str(hw), "--ckpt-dir", str(other)]) == 2
    assert "'notes', which is not a checkpoint" in capsys.readouterr().err


def _res(step_s=0.01, skipped=False):
    return SimpleNamespace(step_s=step_s, device_peak_bytes=100, rss_peak_bytes=1000, skipped=skipped, timeline=None)


def test_warm_up_skipped_steps_and_the_step_after_a_checkpoint_are_not_compared():
    check = PlanCheck(Prediction(step_s=0.01, device_peak_bytes=100, host_rss_bytes=900, tokens_per_s=1.0,
                                 source="x"))
    got = [check.observe(s, _res()) for s in range(1, WARMUP_STEPS + 1)]
    assert got == [{}] * WARMUP_STEPS
    rec = check.observe(3, _res(0.012))
    assert rec["step_s"] == 0.012 and rec["predicted_step_s"] == 0.01
    assert PlanCheck.versus(rec) == "step +20% dev +0% RSS +11%"
    check.after_break()
    assert check.observe(4, _res()) == {}
    assert check.observe(5, _res(skipped=True)) == {}
    assert check.observe(6, _res(0.008))["predicted_rss_bytes"] == 900
    assert [m.step for m in check.steps] == [3, 6] and check.summary()["step_s"] == pytest.approx(0.01)


def test_a_data_parallel_run_says_it_is_not_checked():
    tr = SimpleNamespace(dist=SimpleNamespace(world=2))
    check, line = train_plan.plan_for(SimpleNamespace(hardware="hw.toml"), tr, CPU_HW, None)
    assert check is None and line.startswith("plan: not checked on a data-parallel run")
    cfg = SimpleNamespace(outputs=SimpleNamespace(report_dir="r"), checkpoints=SimpleNamespace(ckpt_dir="ck"))
    assert train_plan.report_folder(cfg, PlanCheck(None), 2) is None and train_plan.report_folder(cfg, None, 1) is None


def test_the_progress_bar_shows_the_step_against_the_plan(tmp_path, hw, capsys):
    run = [a for a in RUN if a != "--no-progress"]
    assert main(["train", *run, "--steps", "3", "--hardware", str(hw)]) == 0
    err = capsys.readouterr().err
    assert "vs plan=step " in err and " dev " in err and " RSS " in err, err


def test_a_prediction_that_fails_does_not_stop_the_run(tmp_path, hw, capsys, monkeypatch):
    from horizon_exec.train import plan_check
    from horizon_sim.errors import HorizonError

    def fails(*a, **k):
        raise HorizonError("no lane for op 3")
    monkeypatch.setattr(plan_check, "predict", fails)
    rep = tmp_path / "plan"
    assert main(["train", *RUN, "--steps", "3", "--hardware", str(hw), "--report-dir", str(rep)]) == 0
    out = capsys.readouterr().out
    assert f"plan: not checked: the planner cannot simulate this run on --hardware {hw}: no lane for op 3" in out
    assert "final loss" in out and list(rep.iterdir()) == []


def test_a_run_stopped_by_a_signal_still_writes_its_report(tmp_path, hw, capsys, monkeypatch):
    import os
    import signal

    from horizon_exec.runtime.trainer import Trainer
    real, ran = Trainer.step, []

    def step(self, *a, **kw):
        res = real(self, *a, **kw)
        ran.append(1)
        if len(ran) == 4:  # the run stops at this step's boundary, exit 143
            os.kill(os.getpid(), signal.SIGTERM)
        return res
    monkeypatch.setattr(Trainer, "step", step)
    rep = tmp_path / "plan"
    assert main(["train", *RUN, "--steps", "50", "--hardware", str(hw), "--report-dir", str(rep)]) == 143
    out = capsys.readouterr().out
    assert "plan vs measured over 2 step(s)" in out and (rep / "report.md").is_file()


def test_a_report_that_cannot_be_written_is_one_line_exit_1(tmp_path, hw, capsys):
    import os
    rep = tmp_path / "plan"
    rep.mkdir()
    os.mkfifo(rep / "report.md")  # never opened (it would block): refused by its kind
    assert main(["train", *RUN, "--steps", "3", "--hardware", str(hw), "--report-dir", str(rep)]) == 1
    out, err = capsys.readouterr()
    assert "final loss" in out and "plan vs measured over 1 step(s)" in out and len(err.strip().splitlines()) == 1, err
    assert err.startswith("horizon train: error: ") and "report.md" in err and "FIFO" in err
    assert "the training itself finished" in err


def test_a_quick_estimate_is_compared_but_reported_beside_the_checkpoints_only_when_asked(tmp_path, capsys,
                                                                                          monkeypatch):
    """Speeds that were not measured on this machine (measure/machine's quick estimate) give the
    start line, the log's keys and the closing line, but no report folder among the checkpoints
    unless --report-dir asks for one."""
    from horizon_exec.measure.machine import ESTIMATE
    _this_machine(monkeypatch, "estimate: measured here in 3.0 s", ESTIMATE)
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    assert main(["train", *RUN, "--steps", "3", "--ckpt-dir", str(ck), "--log-file", str(log)]) == 0
    out = capsys.readouterr().out
    assert "(estimate: measured here in 3.0 s)" in out and "plan vs measured over 1 step(s)" in out
    assert "plan report: not written beside the checkpoints, the prediction being a quick estimate" in out
    assert set(PLAN_KEYS) <= set(_log(log)[-1]) and not (ck / "report").exists()
    rep = tmp_path / "plan"
    assert main(["train", *RUN, "--steps", "3", "--report-dir", str(rep)]) == 0
    assert (rep / "report.md").is_file()


def test_a_description_without_a_measured_runtime_takes_the_admissions():
    """measure/machine's quick estimate carries runtime_overhead_GiB = 0 ('not measured'): the
    RSS prediction then counts the admission's runtime figure, not nothing."""
    from dataclasses import replace

    from horizon_exec.train.plan_check import predict
    from horizon_sim.schedule import build_schedule
    from horizon_sim.specs.layout import Layout
    from horizon_sim.specs.policy import Policy
    from horizon_exec.measure.validate import QUICK_CONFIGS
    sched = build_schedule(QUICK_CONFIGS[0].model, Policy(batch=1, seq=64), Layout(1))
    unmeasured = replace(CPU_HW, host=replace(CPU_HW.host, runtime_overhead_GiB=0.0))
    p = predict(sched, unmeasured, source="estimate", runtime_bytes=300 * 2**20)
    assert p.rss_terms["runtime"] == 300 * 2**20
    q = predict(sched, CPU_HW, source="file", runtime_bytes=300 * 2**20)  # a measured one is kept
    assert q.rss_terms["runtime"] == int(CPU_HW.host.runtime_overhead_GiB * 2**30)


def test_a_cpu_files_peak_is_set_against_the_runs_compute_threads():
    """MFU's peak from a CPU backend's file is its peak at the threads it was measured with; a
    run on twice as many is set against twice the peak (a 1-thread file put a 2-thread run at
    132% MFU)."""
    from dataclasses import replace

    from horizon_exec.cli.train_cmd import _peak_flops
    hw = replace(CPU_HW, device=replace(CPU_HW.device, compute_threads=1))
    cfg = SimpleNamespace(policy=SimpleNamespace(compute_dtype="fp32"), gpu=None)
    assert _peak_flops(cfg, hw, 1) == (pytest.approx(0.1e12), "cpu-core fp32 peak 0.1 TFLOP/s")
    peak, what = _peak_flops(cfg, hw, 2)
    assert peak == pytest.approx(0.2e12) and what == "cpu-core fp32 peak 0.1 TFLOP/s x 2/1 threads"
    assert _peak_flops(cfg, CPU_HW, 2)[0] == pytest.approx(0.1e12)  # a file that does not say its threads
