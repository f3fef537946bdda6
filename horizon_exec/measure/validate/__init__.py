"""`horizon validate`: run small configurations through the executor, simulate the same Schedule
on a calibrated HardwareSpec, and compare, configuration by configuration:

  step time         median measured step (perf_counter around one engine run) against the
                    simulated step (the last op's end)
  busy time         per lane, seconds the lane runs ops (sum of op durations)
  overlap           the fraction of the copy/CPU lanes' busy time that runs while the compute
                    lane is busy (interval union intersection); errors in percentage points
  device peak       arena buffers + measured op temporaries (the executor) against the
                    simulated peak (the Schedule's static device buffers included: slots,
                    RoPE tables, labels)
  host RSS          the process's peak resident set (VmHWM) against process_rss.predict_rss
                    (several ranks: the node's, procfs.node_rss_bytes)

Data-parallel configurations (Config.ranks > 1) run that many processes on this machine, the
node store shared, gloo over loopback; the prediction lays the calibrated file out for them
(horizon_sim/specs/cpu_ranks.py). CPU backend only.

Each configuration runs in a process of its own (probe.Session), so each RSS peak is its own;
the configurations are measured interleaved, a few steps of each in turn, so they all sample
the machine over the same stretch of time (a shared machine's speed drifts by tens of percent
over seconds); each turn starts with one unmeasured step. Warm-up steps are dropped and every
measured figure is the median over the rest.
Writes reports/validation.md, reports/validation.csv and one predicted-vs-measured Gantt
overlay per configuration, reports/validation_<name>.png.

The package: configs (the configurations), metrics (one timeline's figures), measure (the
interleaved runs), compare (one configuration's prediction against its measurement),
validation (the result), report (the files and texts); validate() here ties them together.
"""
import time
from pathlib import Path

import pandas as pd

from horizon_exec.measure.validate.compare import MiB, Outcome, compare
from horizon_exec.measure.validate.configs import CONFIGS, QUICK_CONFIGS, Config
from horizon_exec.measure.validate.corrected import machine_moved, scaled_hardware
from horizon_exec.measure.validate.measure import PER_TURN, measure
from horizon_exec.measure.validate.metrics import LANES, timeline_metrics
from horizon_exec.measure.validate.report import COST_TERMS, dumps, figures_text, markdown, speed_text, write_reports
from horizon_exec.measure.validate.validation import Validation
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import HardwareSpec

__all__ = ["CONFIGS", "COST_TERMS", "Config", "LANES", "MiB", "Outcome", "PER_TURN", "QUICK_CONFIGS",
           "Validation", "compare", "dumps", "figures_text", "markdown", "measure", "speed_text",
           "timeline_metrics", "validate", "write_reports"]


def validate(hw: HardwareSpec, configs=CONFIGS, *, steps: int = 6, warmup: int = 1, device: str = "cpu",
             out_dir="reports", plots: bool = True, say=print) -> Validation:
    """Run, simulate and compare every configuration; write the report files into `out_dir`
    (None: write nothing). `say`: progress lines (None: quiet)."""
    from horizon_exec.measure.drift import DriftProbe
    multi = [c.name for c in configs if c.ranks > 1]
    if multi and device != "cpu":
        raise HorizonError(f"configuration(s) {', '.join(multi)} run several ranks on this machine's cores: "
                           f"validate runs data-parallel configurations on the CPU backend only, not {device}")
    t0 = time.perf_counter()
    outcomes = []
    ref = DriftProbe(hw, configs, device)
    try:
        results = measure(configs, steps=steps, warmup=warmup, device=device, say=say, between=ref.sample)
    finally:
        ref.close()
    drift = ref.drift.summary()
    if say:
        say(speed_text(drift))
    for cfg, res in zip(configs, results):
        o = compare(cfg, hw, res, device)
        outcomes.append(o)
        if say:
            r = o.row
            say(f"validate {cfg.name:<11} step {r['step_s_meas'] * 1e3:7.1f} ms measured, "
                f"{r['step_s_pred'] * 1e3:7.1f} predicted ({r['step_s_err']:+.1%}); device peak "
                f"{r['device_peak_MiB_err']:+.1%}, host RSS {r['rss_MiB_err']:+.1%}")
    if machine_moved(drift):  # the machine was not the calibrated one: the errors on it too
        fast = scaled_hardware(hw, drift.get("gemm_speed"), drift.get("fixed_cost_speed"))
        for o, cfg, res in zip(outcomes, configs, results):
            c = compare(cfg, fast, res, device).row
            o.row["step_s_pred_corrected"], o.row["step_s_err_corrected"] = c["step_s_pred"], c["step_s_err"]
    table = pd.DataFrame([o.row for o in outcomes])
    v = Validation(hw, outcomes, table, time.perf_counter() - t0, drift=drift)
    if out_dir is not None:
        v.files = write_reports(v, Path(out_dir), plots=plots)
    return v
