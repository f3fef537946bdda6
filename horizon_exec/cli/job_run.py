"""`horizon train --job JOB.toml [flags]`: train the job a planner command saved (docs/job.md).

The job's values become the run's flags, except the flags given on the command line: those
override their field (which were given: cli/explicit_flags.py, so a flag given with its
default value still overrides the job). Before anything is
loaded (apply_job): the job is read (one line naming the file and key for a bad value, exit 2),
merged into the arguments, and this machine compared with the job's; --on-other-machine says
what then happens: replan (the default: plan the job's policy for this machine and run it),
refuse (exit 2) or run (as planned). Once the model is read (JobRun.check): the plan's
prediction is printed, the run's Schedule is built and its digest compared with the job's:
"schedule <digest>: as planned", or which override, implied field, model or layout changed it.

A data-parallel run: the launcher merges the job and marks the arguments (job_applied), so the
ranks it starts with those arguments (dist/launch.py ARGS_ENV) train what it checked without
reading the job again; a job planned for several ranks launches that many unless
--nproc-per-node/--nnodes are given.
"""
import argparse
from dataclasses import dataclass, fields

from horizon_sim.cli.explicit_flags import EXPLICIT, record_explicit
from horizon_sim.cli.policy_args import policy_to_args
from horizon_sim.errors import HorizonError
from horizon_sim.job.digest import model_digest, schedule_digest, short
from horizon_sim.job.sections import Job
from horizon_sim.specs.policy import Policy

ON_OTHER_MACHINE = ("replan", "refuse", "run")
REPLANNED = ("--on-other-machine replan: the job's policy is planned on this machine's description (--hardware, "
             "else its calibration or an estimate: the run's 'plan:' line below), not on the job's [hardware]")
RUN_AS_PLANNED = "--on-other-machine run: runs on the job's [hardware] as planned (its prediction is that machine's)"
POLICY_DEST = {"keep_last": "keep_activations", "split_master": "master_dtype", "working_copy": "no_working_copy"}
"""Policy field -> the train flag's dest, where they are not spelled the same."""


def add_job_args(p: argparse.ArgumentParser) -> None:
    """--job and --on-other-machine; then every option of `p` records whether it was given
    (call last, once the parser has all its options)."""
    g = p.add_argument_group("job")
    g.add_argument("--job", default=None, metavar="JOB.toml",
                   help="train a job file (`horizon plan|simulate|tune --save-job`): its model, policy, optimizer, "
                        "data and outputs; every flag given overrides its field, and the run says whether its "
                        "Schedule is the one planned (docs/job.md)")
    g.add_argument("--on-other-machine", choices=ON_OTHER_MACHINE, default="replan",
                   help="when this machine is not the job's (device, GPU, memory, host RAM, cores): replan its "
                        "policy for this machine and run it (default), refuse (exit 2), or run as planned")
    record_explicit(p)


def job_args(job: Job) -> dict:
    """{dest: value}: the train flags' values the job holds."""
    from horizon_sim.specs.cpu_ranks import is_cpu_backend
    p, r, o, d, out = job.policy, job.run, job.optimizer, job.data, job.outputs
    args = {"model": job.model.source, "device": "cpu" if is_cpu_backend(job.hardware) else "cuda",
            "steps": r.steps, "seed": r.seed, **policy_to_args(p),
            "lr": o.lr, "warmup_steps": o.warmup_steps, "min_lr": o.min_lr, "weight_decay": o.weight_decay,
            "beta1": o.beta1, "beta2": o.beta2, "eps": o.eps,
            "data": d.data, "tokenizer": d.tokenizer, "eos_token": d.eos_token, "eval_fraction": d.eval_fraction,
            "eval_every": d.eval_every, "eval_batches": d.eval_batches,
            "ckpt_dir": out.ckpt_dir, "ckpt_interval": out.save_every, "keep_ckpts": out.keep_ckpts,
            "save_hf": out.save_hf, "save_dtype": out.save_dtype, "save_shard_size": str(out.save_shard_bytes),
            "log_file": out.log_file}
    layout = job.hardware.cluster.layout
    if layout.ranks > 1:
        args.update(nproc_per_node=layout.devices_per_node, nnodes=layout.nodes)
    return args


def _implied(job: Job, given: dict, args: argparse.Namespace) -> dict:
    """{dest: (value, dest of the flag that implies it)} for the job's fields that its own choices
    implied, when the flag choosing them is given and theirs is not: they follow the new choice as
    they would without a job (the clip of the optimizer mode, the master, gradients and working
    copy of the compute dtype)."""
    p, out = job.policy, {}
    if "optimizer" in given:
        if "grad_clip" not in given and p.grad_clip == Policy.default_grad_clip(p.optimizer):
            out["grad_clip"] = (None, "optimizer")
        if "max_host_grads" not in given and args.optimizer != "backward" and p.max_host_grads:
            out["max_host_grads"] = (0, "optimizer")
    if "compute_dtype" in given:
        if "grad_dtype" not in given:  # fp32 compute sends fp32 whatever is asked
            out["grad_dtype"] = (Policy().grad_dtype, "compute_dtype")
        if "no_working_copy" not in given and p.compute_dtype == "fp32":
            out["no_working_copy"] = (False, "compute_dtype")  # fp32 compute had none: the new dtype's default
    if "master_dtype" not in given and p.master_is_default:
        by = next((k for k in ("compute_dtype", "no_working_copy") if k in given), None)
        if by:
            out["master_dtype"] = (None, by)  # the default master for the new choices (train_cmd resolves it)
    return out


def _shown(v) -> str:
    return "on" if v is True else "off" if v is False else "none" if v is None else f"{v:g}" \
        if isinstance(v, float) else str(v)


@dataclass
class JobRun:
    """A job merged into `horizon train`'s arguments, and what is left to say about it."""
    path: str
    job: Job
    given: dict
    """{dest: option string} of the flags given on the command line."""
    overrides: list
    """'--flag value (the job's: value)' for each given flag that changed a job value."""
    implied: dict
    """{dest: option string} of the values reset because a flag given implies them."""
    machine: list
    """What differs between this machine and the job's (job_machine.differences)."""
    on_other_machine: str

    def check(self, cfg, model, launch) -> None:
        """Print the job's lines: what it is, the plan's prediction, the overrides, the machine,
        and whether the run's Schedule is the job's (its digest); replan when asked."""
        from horizon_sim.schedule import build_schedule
        from horizon_sim.specs.layout import Layout
        job = self.job
        hw = job.hardware
        print(f"job: {self.path}: {job.model.source} on {hw.name or hw.device.name} "
              f"(planned by {job.prediction.planner_version})")
        print(job.planned_line)
        if self.overrides:
            print("overrides: " + ", ".join(self.overrides))
        layout = Layout(launch.nproc_per_node, launch.nnodes)
        digest = schedule_digest(build_schedule(model, cfg.policy, layout))
        planned = job.prediction.schedule_digest
        if digest == planned:
            print(f"schedule {short(digest)}: as planned")
        else:
            print(f"schedule {short(digest)}: not as planned (the job's {short(planned)}): changed by "
                  + "; ".join(self._causes(cfg.policy, model, layout)))
        if self.machine:
            print("machine: this one differs from the job's: " + ", ".join(self.machine))
            print("machine: " + (REPLANNED if self.on_other_machine == "replan" else RUN_AS_PLANNED))

    def _causes(self, policy: Policy, model, layout) -> list[str]:
        job, out = self.job, []
        for f in fields(Policy):
            was, now = getattr(job.policy, f.name), getattr(policy, f.name)
            if was == now:
                continue
            dest = POLICY_DEST.get(f.name, f.name)
            what = f"policy {f.name} {_shown(now)} (the job's: {_shown(was)})"
            if dest in self.given:
                out.append(f"{self.given[dest]}: {what}")
            elif dest in self.implied:
                out.append(f"{what}, implied by {self.implied[dest]}")
            elif f.name == "attention":
                out.append(f"{what}: horizon train has no flag for it")
            else:
                out.append(f"{what}: this machine's default")
        if model_digest(model) != job.model.digest:
            by = self.given.get("model") or self.given.get("init_from")
            out.append(f"the model {model.name}" + (f" ({by})" if by else f": {job.model.source} no longer resolves "
                                                                           f"to the spec the job was planned with"))
        if layout != job.hardware.cluster.layout:
            out.append(f"the layout {layout} (the job's: {job.hardware.cluster.layout})")
        return out or [f"the Schedule builder: this Horizon builds the same inputs differently from "
                       f"{job.prediction.planner_version}"]


def apply_job(args: argparse.Namespace) -> JobRun | None:
    """Merge args.job into `args` (module docstring); None without a job, or in a rank whose
    launcher merged it. HorizonError (exit 2) for a bad job file, or another machine under
    --on-other-machine refuse."""
    path = getattr(args, "job", None)
    if not path and "on_other_machine" in (getattr(args, EXPLICIT, None) or {}):
        raise HorizonError("--on-other-machine says what --job does on a machine that is not the job's: give --job")
    if not path or getattr(args, "job_applied", False):
        return None
    from horizon_exec.cli.job_machine import differences
    from horizon_sim.job.toml import read_job
    job = read_job(path)
    given = dict(getattr(args, EXPLICIT, None) or {})
    values = job_args(job)
    if "init_from" in given and "model" not in given:
        del values["model"]  # the model is the checkpoint's then, not the job's
    overrides = [f"{given[d]} {_shown(getattr(args, d))} (the job's: {_shown(v)})"
                 for d, v in values.items() if d in given and getattr(args, d) != v]
    for d, v in values.items():
        if d not in given:
            setattr(args, d, v)
    implied = _implied(job, given, args)
    for d, (v, _) in implied.items():
        setattr(args, d, v)
    implied_by = {d: given[by] for d, (_, by) in implied.items()}
    machine = differences(job.hardware, args.device)
    mode = args.on_other_machine
    if machine and mode == "refuse":
        raise HorizonError(f"--job {path}: this machine is not the job's: {', '.join(machine)}; "
                           "--on-other-machine replan plans the job for it, run runs it as planned")
    if "hardware" not in given and "gpu" not in given and (not machine or mode == "run"):
        args.hardware = path  # the job's machine: MFU's peak, the admission's speeds, the core split
    args.job_applied = True  # a rank started with these arguments trains them as they are
    return JobRun(path=path, job=job, given=given, overrides=overrides, implied=implied_by, machine=machine,
                  on_other_machine=mode)
