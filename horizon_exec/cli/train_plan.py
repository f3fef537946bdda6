"""`horizon train` checks itself against its plan (issue 39, item 3): the glue between the CLI
and train/plan_check.py (the prediction, the compared steps) and train/plan_report.py (the
report). At start one line, the prediction or why there is none; after warm-up each metrics-log
line and the progress bar carry measured vs predicted; at the end the report goes into
RunConfig.report_folder (--report-dir, else <ckpt-dir>/report, else none) and one line says
where.

The hardware the prediction runs on: --hardware when given. Without it there is no
prediction (one line says so) and no report folder is made.
"""
from horizon_sim.errors import HorizonError
from horizon_sim.units import fmt_bytes

NO_HARDWARE = ("plan: not checked: no hardware file to predict this machine's speed with (give --hardware FILE, "
               "e.g. from `horizon calibrate`)")


def report_dir(cfg, world: int) -> str | None:
    """The folder the run's report goes into, None when it makes none: no prediction (no
    hardware) or a data-parallel run (each rank would measure only its own process)."""
    if world > 1 or not cfg.hardware:
        return None
    return cfg.report_folder


def plan_for(cfg, tr, hardware, ds):
    """(PlanCheck or None, the start line): the prediction of `tr`'s own Schedule on
    `hardware` (as loaded from cfg.hardware; None: no prediction)."""
    from horizon_exec.train.plan_check import PlanCheck, dataset_bytes, predict
    if tr.dist.world > 1:
        return None, ("plan: not checked on a data-parallel run (each rank measures its own process; "
                      "`horizon validate` compares data-parallel configurations)")
    if hardware is None:
        return None, NO_HARDWARE
    try:
        pred = predict(tr.sched, hardware, source=f"hardware file {cfg.hardware}",
                       backend="cpu" if cfg.trainer.runtime.device == "cpu" else "cuda",
                       compute_threads=getattr(tr.backend, "compute_threads", None), data_bytes=dataset_bytes(ds))
    except HorizonError as e:  # the check is the run's companion: it never stops the training
        return None, f"plan: not checked: the planner cannot simulate this run on {cfg.hardware}: {e}"
    return PlanCheck(pred), pred.line()


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
    # worded as `horizon validate` words a configuration: errors are (predicted - measured) / measured
    say(f"plan vs measured over {meas['steps']} step(s): step {step['measured']:.1f} ms measured, "
        f"{step['predicted']:.1f} predicted ({step['error']:+.1%}); device peak "
        f"{fmt_bytes(meas['device_peak_bytes'])} measured ({dev['error']:+.1%}), host RSS "
        f"{fmt_bytes(meas['rss_bytes'])} ({rss['error']:+.1%})")
    folder = report_dir(cfg, tr.dist.world)
    if folder:
        try:
            files = write_report(folder, check, run=run_name(tr))
        except HorizonError as e:
            if strict:
                raise
            return say(f"plan report not written: {e}")
        say(f"plan report: {', '.join(str(f) for f in files)}")
