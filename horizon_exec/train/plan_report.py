"""The run's predicted-vs-measured report (issue 39, item 3), the one `horizon validate` writes
for its configurations, for this run: written at the end into --report-dir (default
<ckpt-dir>/report) as

    report.md     the table (step time, tokens/s, device peak, host peak RSS: predicted,
                  measured, error), the predicted RSS terms and the overlay
    report.csv    the table, one row per figure, for machines
    report.json   the same rows with the run's facts (hardware, steps compared)
    overlay.png   a measured step's timeline under the predicted one (validate's plot_overlay); not
                  written where the prediction was extended from fewer micro-batches

Errors are validate's: (predicted - measured) / measured. Each file is written whole or not at
all (safe_files.write_atomic), so a full disk leaves no half a report.
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


def rows(pred, meas: dict) -> list[dict]:
    """One row per figure: name, unit, predicted, measured, error."""
    tok = pred.tokens_per_s * pred.step_s  # tokens of one step
    figures = [("step time (median)", "ms", pred.step_s * 1e3, meas["step_s"] * 1e3),
               ("tokens/s (median step)", "tokens/s", pred.tokens_per_s, tok / meas["step_s"]),
               ("device peak (median)", "MiB", pred.device_peak_bytes / MiB, meas["device_peak_bytes"] / MiB),
               ("host peak RSS", "MiB", pred.host_rss_bytes / MiB, meas["rss_bytes"] / MiB)]
    return [{"figure": f, "unit": u, "predicted": p, "measured": m,
             "error": (p - m) / m if m else math.nan} for f, u, p, m in figures]


def _csv(table: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(table[0]), lineterminator="\n")
    w.writeheader()
    for r in table:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


def markdown(pred, meas: dict, table: list[dict], run: str) -> str:
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
              "the process's peak resident set (VmHWM) at the last compared step, loading included.", "",
              "## Host RSS terms (predicted)", "", "| term | bytes |", "|:---|---:|"]
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
    pred, meas = check.pred, check.summary()
    table = rows(pred, meas)
    facts = {"run": run, "hardware": pred.source, "steps_compared": meas["steps"],
             "first_step": meas["first_step"], "last_step": meas["last_step"],
             "device_peak_max_bytes": meas["device_peak_max_bytes"], "rss_terms_bytes": pred.rss_terms,
             "figures": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
                         for r in table]}
    md, md_path = markdown(pred, meas, table, run), folder / FILES[0]
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
