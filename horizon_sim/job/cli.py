"""`--save-job JOB.toml` for `horizon plan`, `simulate` and `tune`, and the `horizon train` lines
they print (docs/job.md).

    add_save_job_arg(p)                          # in configure()
    check_job_path(a.save_job)                   # first thing in run(), before any planning
    job = save_job(a, model, hw, policy)         # once the policy is decided: writes the file
    print(saved_line(a.save_job, job))
"""
import argparse
import shlex

from horizon_sim.job.digest import short
from horizon_sim.job.sections import Job
from horizon_sim.job.toml import check_job_path, write_job
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

__all__ = ["add_save_job_arg", "check_job_path", "save_job", "saved_line", "train_command"]


def add_save_job_arg(p: argparse.ArgumentParser, what: str = "the planned job") -> None:
    p.add_argument("--save-job", default=None, metavar="JOB.toml",
                   help=f"write {what} to a job file: the model, this machine, every policy field resolved, "
                        "the training side at horizon train's defaults (edit them there) and the prediction; "
                        "`horizon train --job JOB.toml` trains it (docs/job.md)")


def save_job(a: argparse.Namespace, model: ModelSpec, hw: HardwareSpec, policy: Policy, *,
             result=None, split=None) -> Job:
    """Write the job of `policy` on `hw` to a.save_job and return it. `result`/`split`: the step
    as the command already priced it (else priced here as `horizon plan` prices it)."""
    from horizon_sim.job.build import job_from_plan, plan_policy
    if result is None:
        result, split = plan_policy(model, hw, policy, getattr(a, "compute_threads", None))
    job = job_from_plan(source=a.model, model=model, hardware=hw, result=result, split=split)
    write_job(job, a.save_job)
    return job


def saved_line(path: str, job: Job) -> str:
    return (f"job       wrote {path} (schedule {short(job.prediction.schedule_digest)}); "
            f"train it: horizon train --job {shlex.quote(path)}")


def train_command(a: argparse.Namespace, hw: HardwareSpec, policy: Policy) -> str:
    """The `horizon train` command line that runs `policy` exactly on the machine the flags `a`
    describe: the policy's flags (horizon plan's, plus the compute dtype and the master, whose
    defaults in train depend on the machine), --no-search (the knobs left at their defaults are
    the row's, not for train's own search to choose) and where it runs."""
    from horizon_sim.plan.advice import policy_flags
    from horizon_sim.specs.cpu_ranks import is_cpu_backend
    flags = policy_flags(policy).split()
    if "--compute-dtype" not in flags:
        flags += ["--compute-dtype", policy.compute_dtype]
    if "--master-dtype" not in flags and not policy.adapters:
        flags += ["--master-dtype", policy.master_choice]
    flags.append("--no-search")
    where = ["--hardware", a.hardware] if a.hardware else ["--gpu", a.gpu]
    if not is_cpu_backend(hw):
        where += ["--device", "cuda"]
    layout = hw.cluster.layout
    if layout.ranks > 1:
        where += ["--nproc-per-node", str(layout.devices_per_node)] + (
            ["--nnodes", str(layout.nodes)] if layout.nodes > 1 else [])
    return " ".join(["horizon", "train", "--model", shlex.quote(a.model), *map(shlex.quote, where), *flags])
