"""The run's predicted-vs-measured report (issue 39, item 3), the one `horizon validate` writes
for its configurations, for this run: written at the end into --report-dir (default
<ckpt-dir>/report) as

    report.md     the table (step time, tokens/s, device peak, host peak RSS: predicted,
                  measured, error), the predicted RSS terms and the overlay
    report.csv    the table, one row per figure, for machines
    report.json   the same rows with the run's facts (hardware, steps compared)
    overlay.png   a measured step's timeline under the predicted one (validate's plot_overlay); not
                  written where the prediction was extended from fewer micro-batches

Errors are validate's: (predicted - measured) / measured. Where the step was far off and the
machine's speed had moved since its file was measured (train/speed_recheck.py), the table has a
second step-time row, predicted at the speed the machine ran at after the run. Each file is
written whole or not at all (safe_files.write_atomic), so a full disk leaves no half a report.
"""
import csv
import io
import json
import math
from pathlib import Path

from horizon_exec.checkpoints.fileio import OutputError, make_dirs, os_error_text
from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import write_atomic
from horizon_sim.units import MiB, fmt_bytes

FILES = ("report.md", "report.csv", "report.json", "overlay.png")


AT_SPEED_NOW = "step time (median), at the machine's speed after the run"
"""The row of a re-prediction on the file scaled to the drift probe's figures (train/speed_recheck.py)."""


def rows(pred, meas: dict, recheck=None) -> list[dict]:
    """One row per figure: name, unit, predicted, measured, error; with a `recheck` whose machine
    moved, the step time re-predicted at its speed after the run as well."""
    tok = pred.tokens_per_s * pred.step_s  # tokens of one step
    figures = [("step time (median)", "ms", pred.step_s * 1e3, meas["step_s"] * 1e3),
               ("tokens/s (median step)", "tokens/s", pred.tokens_per_s, tok / meas["step_s"]),
               ("device peak (median)", "MiB", pred.device_peak_bytes / MiB, meas["device_peak_bytes"] / MiB),
               ("host peak RSS", "MiB", pred.host_rss_bytes / MiB, meas["rss_bytes"] / MiB)]
    if recheck is not None and recheck.prediction is not None:
        figures.append((AT_SPEED_NOW, "ms", recheck.prediction.step_s * 1e3, meas["step_s"] * 1e3))
    return [{"figure": f, "unit": u, "predicted": p, "measured": m,
             "error": (p - m) / m if m else math.nan} for f, u, p, m in figures]


def _csv(table: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(table[0]), lineterminator="\n")
    w.writeheader()
    for r in table:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


def _speed_text(recheck) -> str:
    from horizon_exec.measure.validate.corrected import MOVED, factors_text
    from horizon_exec.train.speed_recheck import RECHECK
    what = (f"it had not moved (within {MOVED:.0%}), so the step's error is the cost model's"
            if recheck.prediction is None else f"the row '{AT_SPEED_NOW}' is the same Schedule simulated on the file scaled to that speed "
                 "(GEMM and attention rates by the GEMM figure, per-op fixed costs by the other)")
    return (f"The step was more than {RECHECK:.0%} off its prediction, so the machine's speed was probed after "
            f"the run (validate's drift references, predicted / measured time): {factors_text(recheck.drift)}; {what}.")


def markdown(pred, meas: dict, table: list[dict], run: str, recheck=None) -> str:
    lines = [f"# Predicted vs measured: {run}", "",
             f"Prediction: the planner's simulation of this run's Schedule on {pred.source}. Measured: "
             f"{meas['steps']} step(s) after warm-up (steps {meas['first_step']} to {meas['last_step']}; the "
             "first steps of the process, skipped steps and each step after a checkpoint or an eval are not "
             "compared), the step's engine run as `horizon validate` times it. Errors are "
             "(predicted - measured) / measured.", "",
             "| figure | unit | predicted | measured | error |", "|:---|:---|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['figure']} | {r['unit']} | {r['predicted']:,.4g} | {r['measured']:,.4g} | "
                     f"{r['error']:+.1%} |")
    lines += ["", f"Largest measured device peak: {fmt_bytes(meas['device_peak_max_bytes'])}. Host peak RSS is "
              "the process's peak resident set (VmHWM) at the last compared step, loading included.", ""]
    if recheck is not None:
        lines += [_speed_text(recheck), ""]
    lines += ["## Host RSS terms (predicted)", "", "| term | bytes |", "|:---|---:|"]
    lines += [f"| {k} | {fmt_bytes(v)} |" for k, v in pred.rss_terms.items()]
    if pred.timeline is None:
        counts = ", ".join(map(str, pred.simulated_micro_batches))
        lines += ["", "## Overlay", "", f"None: the planner simulated this step at {counts} micro-batches and "
                  "extended its figures to the run's count, so no simulated timeline is of this run's Schedule.", ""]
        return "\n".join(lines)
    lines += ["", "## Overlay", "", "Predicted bars (light, upper row) above the measured step whose time is the "
              "median of the last ones compared (lower row), per lane; grey lines join each compute op's "
              "predicted and measured start.", "", "![overlay](overlay.png)", ""]
    return "\n".join(lines)


def write_report(folder, check, *, run: str) -> list[Path]:
    """Write the report of `check` (a PlanCheck with compared steps) into `folder` (made here when
    missing); OutputError naming the file when it cannot be written."""
    from horizon_sim.report.overlay import plot_overlay
    folder = Path(folder)
    try:  # beside the checkpoints it is made now (--report-dir was made before the first step)
        make_dirs(folder)
    except OSError as e:
        raise OutputError(f"cannot make the report folder {str(folder)!r}: {os_error_text(e)}; the training itself "
                          "finished") from None
    pred, meas, rc = check.pred, check.summary(), check.recheck
    table = rows(pred, meas, rc)
    facts = {"run": run, "hardware": pred.source, "steps_compared": meas["steps"],
             "machine_speed_after_run": rc.drift if rc is not None else None,
             "first_step": meas["first_step"], "last_step": meas["last_step"],
             "device_peak_max_bytes": meas["device_peak_max_bytes"], "rss_terms_bytes": pred.rss_terms,
             "figures": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
                         for r in table]}
    md, md_path = markdown(pred, meas, table, run, rc), folder / FILES[0]
    out = []
    try:
        for name, data in ((FILES[0], md + "\n"), (FILES[1], _csv(table)),
                           (FILES[2], json.dumps(facts, indent=1, allow_nan=False) + "\n")):
            out.append(write_atomic(folder / name, data.encode(), "the plan report"))
        err = table[0]["error"]
        if pred.timeline is not None:
            plot_overlay(pred.timeline, meas["timeline"], folder / FILES[3],
                         title=f"{run}\nstep measured {meas['step_s'] * 1e3:.0f} ms, predicted "
                               f"{pred.step_s * 1e3:.0f} ms ({err:+.1%})")
            out.append(folder / FILES[3])
    except HorizonError as e:
        raise OutputError(f"{e}; the training itself finished ({md_path.parent} may hold part of the report)") from None
    return out
