"""`horizon train` checks itself against its plan (issue 39, item 3): the glue between the CLI
and train/plan_check.py (the prediction, the compared steps) and train/plan_report.py (the
report). At start one line, the prediction or why there is none; after warm-up each metrics-log
line and the progress bar carry measured vs predicted; at the end one line of measured vs
predicted and the report, in report_folder().

The machine the prediction runs on is the run's MachineDescription (measure/machine, the one the
admission simulates on): --hardware, else this machine's cached calibration, else a quick
estimate; on the CPU backend that is the calibration the machine has. Where the report goes:
--report-dir whatever the source; else beside the checkpoints (<ckpt-dir>/report) when the
speeds were measured on this machine (--hardware, a calibration), not a quick estimate, which
would make every run's report a comparison with a guess; else none.
"""
import os

from horizon_exec.measure.machine import CALIBRATED, FILE
from horizon_exec.train import speed_recheck
from horizon_exec.train.ckpt_dir_rules import REPORT
from horizon_sim.errors import HorizonError
from horizon_sim.units import fmt_bytes


def plan_for(cfg, tr, machine, ds):
    """(PlanCheck or None, the start line): the prediction of `tr`'s own Schedule on `machine`
    (a MachineDescription; None: none was made)."""
    from horizon_exec.train.plan_check import PlanCheck, dataset_bytes, predict
    if tr.dist.world > 1:
        return None, ("plan: not checked on a data-parallel run (each rank measures its own process; "
                      "`horizon validate` compares data-parallel configurations)")
    if machine is None:
        return None, "plan: not checked: no description of this machine to predict the run with"

    def on(hw, source=machine.source):
        return predict(tr.sched, hw, source=source, backend="cpu" if cfg.trainer.runtime.device == "cpu" else "cuda",
                       compute_threads=getattr(tr.backend, "compute_threads", None), data_bytes=dataset_bytes(ds),
                       # a description that did not measure the runtime (an estimate): the admission's figure
                       runtime_bytes=tr.admission.host_by_role.get("runtime") if tr.admission is not None else None)
    try:
        pred = on(machine.hardware)
    except HorizonError as e:  # the check is the run's companion: it never stops the training
        return None, f"plan: not checked: the planner cannot simulate this run on {machine.source}: {e}"
    again = lambda hw: on(hw, f"{machine.source}, scaled to the machine's speed after the run")  # noqa: E731
    return PlanCheck(pred, measured_speeds=machine.kind in (FILE, CALIBRATED), hardware=machine.hardware,
                     repredict=again), pred.line()


def report_folder(cfg, check, world: int) -> str | None:
    """Where the report of `check` goes (module docstring); None: nowhere."""
    if check is None or world > 1:
        return None
    if cfg.outputs.report_dir:
        return cfg.outputs.report_dir
    ck = cfg.checkpoints.ckpt_dir
    return os.path.join(ck, REPORT) if ck and check.measured_speeds else None


def run_name(tr) -> str:
    m, p = tr.model, tr.policy
    return (f"horizon train {m.name}, batch {p.batch}x{p.seq}, K={p.act_ckpt_every}, {p.slots} slots, "
            f"opt {p.optimizer}" + (f", {p.micro_batches} micro" if p.micro_batches > 1 else ""))


def finish(cfg, tr, check, say=print, strict: bool = True) -> None:
    """At the end of a run: say the measured-vs-predicted line, then write the report and say
    where; OutputError when the report cannot be written, or with strict=False (a run stopping
    on a signal, whose exit status says so) a line saying why."""
    from horizon_exec.train.plan_check import WARMUP_STEPS
    from horizon_exec.train.plan_report import rows, write_report
    if check is None:
        return
    meas = check.summary()
    if meas is None:
        return say(f"plan: no step compared ({check.seen} ran; the first {WARMUP_STEPS} of a process, skipped steps and "
                   "each step after a checkpoint or an eval are warm-up), so no report")
    r = {x["figure"]: x for x in rows(check.pred, meas)}
    step, dev, rss = r["step time (median)"], r["device peak (median)"], r["host peak RSS"]
    # worded as `horizon validate` words a configuration: errors are (predicted - measured) / measured,
    # named so, since the progress bar's 'vs plan' says the other way round how the run compares
    say(f"plan vs measured over {meas['steps']} step(s): step {step['measured']:.1f} ms measured, "
        f"{step['predicted']:.1f} predicted (prediction error {step['error']:+.1%}); device peak "
        f"{fmt_bytes(meas['device_peak_bytes'])} measured ({dev['error']:+.1%}), host RSS "
        f"{fmt_bytes(meas['rss_bytes'])} ({rss['error']:+.1%})")
    # far off: the machine's speed now, or the cost model? (not on the way out after a signal)
    if strict and speed_recheck.wanted(check, meas):
        try:
            check.recheck = speed_recheck.recheck(check, tr, cfg.trainer.runtime.device)
        except Exception as e:  # noqa: BLE001 - a companion of a run whose weights are saved: it never fails it
            why = str(e) if isinstance(e, (HorizonError, RuntimeError)) else f"{type(e).__name__}: {e}"
            say(f"plan: the machine's speed could not be probed after the run: {why}")
        else:
            say(speed_recheck.line(check.recheck, meas["step_s"]))
    folder = report_folder(cfg, check, tr.dist.world)
    if folder is None:
        if cfg.checkpoints.ckpt_dir and tr.dist.world == 1:
            say("plan report: not written beside the checkpoints, the prediction being a quick estimate of this "
                "machine (--report-dir DIR writes it anyway; `horizon calibrate` makes it worth one)")
        return
    try:
        files = write_report(folder, check, run=run_name(tr))
    except HorizonError as e:
        if strict:
            raise
        return say(f"plan report not written: {e}")
    say(f"plan report: {', '.join(str(f) for f in files)}")
