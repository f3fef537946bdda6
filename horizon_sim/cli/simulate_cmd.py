"""`horizon simulate`: one predicted step, as a report plus an overlap plot and a Perfetto trace."""
import argparse
import json
from pathlib import Path

from horizon_sim.cli import plan_cmd
from horizon_sim.cli.policy_args import fit_seq_to_positions, policy_from_args
from horizon_sim.errors import HorizonError
from horizon_sim.plan import plan
from horizon_sim.safe_files import refuse_non_regular
from horizon_sim.specs.hf_config import load_model

EXAMPLE = """example:
  horizon simulate --model llama-3.1-8b --gpu h100-pcie --ram 512GiB --plot step.png --trace step.json
  horizon simulate --model dense-120b --gpu h200 --ram 1.5TB --act-ckpt-every 4 --plot step.svg
  open the trace in https://ui.perfetto.dev (or chrome://tracing)"""


def configure(p: argparse.ArgumentParser) -> None:
    plan_cmd.configure(p)  # the same model, hardware and policy flags as `horizon plan`
    p.description = ("Simulate one RAM-centric training step and show its timeline: a Gantt plot of\n"
                     "the copy, compute and CPU lanes over device memory, and a Chrome/Perfetto trace.")
    p.epilog = EXAMPLE
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="write the overlap plot (lanes + device memory); .png, .svg or .pdf")
    p.add_argument("--trace", default=None, metavar="FILE.json",
                   help="write a Chrome trace for ui.perfetto.dev: one event per op, a memory counter")


def _check_out(path: str | None, what: str) -> None:
    """Fail before simulating when an output cannot be written."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise HorizonError(f"--{what} {path!r} is a directory; give a file name")
    if not p.parent.is_dir():
        raise HorizonError(f"--{what} {path!r}: directory {str(p.parent)!r} does not exist")
    refuse_non_regular(p, f"--{what}", allow_chardev=True)  # a FIFO blocks its writer forever


def run(a: argparse.Namespace) -> int:
    if a.sources:  # the presets' sources, as `horizon plan --sources` prints them
        return plan_cmd.run(a)
    _check_out(a.plot, "plot")
    _check_out(a.trace, "trace")
    hw = plan_cmd.machine_from_args(a)
    if a.save_job:
        from horizon_sim.job.cli import check_job_path
        check_job_path(a.save_job)
    model = load_model(a.model)
    fit_seq_to_positions(a, model)
    policy = policy_from_args(a, hw)
    r = plan(model, hw, policy)
    written = {}
    if a.plot:
        from horizon_sim.report.gantt import plot_overlap  # matplotlib only when asked
        plot_overlap(r, a.plot)
        written["plot"] = a.plot
    if a.trace:
        from horizon_sim.report.trace import write_trace
        write_trace(r, a.trace)
        written["trace"] = a.trace
    if a.save_job:  # priced as `horizon plan` prices it (a CPU file at train's core split)
        from horizon_sim.job.cli import save_job
        written["job"] = a.save_job
        job = save_job(a, model, hw, policy)
    if a.json:
        print(json.dumps({**plan_cmd.result_json(r), **written}))
    else:
        print(plan_cmd.report(r))
        if written:
            print()
        for what, path in written.items():
            if what == "job":
                from horizon_sim.job.cli import saved_line
                print(saved_line(path, job))
            else:
                print(f"{what:<10}wrote {path}")
    return 0
