"""`horizon train` without a full policy: the planner chooses the rest (issue 39, item 4).

Each policy flag given pins its knob; the planner searches the others (plan/pinned.py, the one
space `horizon tune` also searches) under the run's batch and sequence, on the machine the run
has: its description (measure/machine: --hardware, else the cached calibration, else a quick
estimate) with the memory the run may use (the admission's budgets: --host-budget, else
MemAvailable + this process; --device-budget, else CUDA's free memory; on the CPU backend the
device is host RAM, counted once), less what the training data will hold. It prints the policy
it chose, its predicted speed and why; the admission then checks it as it checks any policy.

No search: with --job (the job's policy is its plan), --no-search (Policy's defaults for the
flags not given), every knob pinned, a run of several nodes (each node's launcher would choose
on its own memory), or in a rank of a data-parallel run (its launcher chose, and hands it the
flags: the choice is written back into the arguments a launch hands its ranks). A resumed run
keeps the policy its checkpoint was written with for the knobs no flag pins.
"""
import argparse
import os

from horizon_sim.cli.explicit_flags import given as explicit
from horizon_sim.cli.policy_args import policy_to_args
from horizon_sim.plan.pinned import KNOB_DESTS, KNOB_FLAGS, pinned_knobs, pinned_space
from horizon_sim.specs.policy import Policy

NO_SEARCH_HELP = ("the policy flags not given keep their listed defaults (Policy's) instead of the planner's "
                  "choice")


def add_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-search", action="store_true", help=NO_SEARCH_HELP)


def _set_policy(args: argparse.Namespace, p: Policy, keep=frozenset()) -> None:
    """Write `p`'s knobs (and its clip) into the train flags' dests, but those in `keep`."""
    for dest, v in policy_to_args(p).items():
        if (dest in KNOB_DESTS.values() or dest == "grad_clip") and dest not in keep:
            setattr(args, dest, v)


def _resumed(args: argparse.Namespace, given: dict, say):
    """A resumed run keeps the policy its checkpoint was written with (a resume needs the same
    one: checkpoints/ckpt.py check_compatible), for the knobs no flag pins: the RunConfig of
    those flags, or None when the checkpoint records none (the resume then says what is wrong)."""
    from horizon_exec.checkpoints.ckpt import recorded_policy
    from horizon_exec.cli.train_flags import run_config
    from horizon_sim.errors import HorizonError
    path = args.resume or args.ckpt_dir
    # a run of several nodes keeps each node's checkpoints in <ckpt-dir>/node-J, all of one policy
    rec = recorded_policy(path) or recorded_policy(os.path.join(path, f"node-{getattr(args, 'node_rank', 0) or 0}"))
    try:
        p = Policy.from_dict(rec) if rec is not None else None
    except (HorizonError, TypeError):
        p = None
    if p is None:
        return None
    _set_policy(args, p, keep=set(given))
    say("policy: the checkpoint's, as the run being resumed (the planner chooses for a fresh run)")
    return run_config(args)


def choose_policy(args: argparse.Namespace, cfg, model, data_bytes: int, layout, say=print):
    """(the RunConfig `cfg` with the planner's policy when this run searches (module docstring),
    `args` then holding it too; this machine's description when the search read it, else None).
    `cfg` unchanged when it does not search."""
    given = explicit(args)
    if getattr(args, "job", None) or args.no_search or set(pinned_knobs(given)) == set(KNOB_DESTS):
        return cfg, None
    if args.resume is not None:
        return _resumed(args, given, say) or cfg, None
    if layout.nodes > 1:  # each node's launcher would search on its own memory, and might choose differently
        say(f"policy: not searched for a run of {layout.nodes} nodes (each node's launcher would choose on its own "
            "RAM): the flags given and the listed defaults; `horizon tune ... --nodes N --save-job` plans one for all")
        return cfg, None
    from horizon_exec.cli.train_flags import run_config
    from horizon_exec.measure.machine import this_machine
    from horizon_exec.train.policy_search import plan_policy
    from horizon_sim.plan.advice import policy_flags
    from horizon_sim.units import fmt_bytes

    policy, rt, adm = cfg.policy, cfg.trainer.runtime, cfg.trainer.admission
    machine = None if cfg.hardware else this_machine(rt.device, say=say)
    hardware = _hardware_file(cfg.hardware) if cfg.hardware else machine.hardware
    planned = plan_policy(model, policy, given, hardware, device=rt.device, host_budget_bytes=adm.host_budget_bytes,
                          device_budget_bytes=adm.device_budget_bytes, data_bytes=data_bytes, layout=layout)
    res, hw = planned.result, planned.hardware
    if res.best is None:  # nothing fits: the base policy goes on, and the admission says why and what to change
        say("policy: the planner found no policy that fits this machine; running the defaults (the admission below "
            "says what is short)")
        return cfg, machine
    best, row, base = res.best, res.table.iloc[0], res.baseline
    _set_policy(args, best)
    new = run_config(args)
    assert new.policy == best, (new.policy, best)
    pins = [given.get(KNOB_DESTS[k], KNOB_FLAGS[k]) for k in pinned_knobs(given)]  # as the user spelt them
    flags = policy_flags(best, policy) or "the defaults"
    why = (f"{row.tokens_per_s / base['tokens_per_s']:.2f}x the defaults' {base['tokens_per_s']:,.0f} tokens/s"
           if base["fits"] and base["tokens_per_s"] > 0 else f"the defaults do not fit: {base['why_not']}")
    say(f"policy: the planner's choice ({res.evaluated} simulated on {hw.name or hw.device.name}"
        + (f"; pinned by {', '.join(pins)}" if pins else "") + f"): {flags}")
    step_s, at = step_at_run_split(model, best, hw, row.step_time_s, rt.device, rt.compute_threads)
    say(f"policy: predicted {best.tokens / step_s:,.0f} tokens/s, {step_s * 1e3:.1f} ms a step{at} ({why}); "
        f"device {fmt_bytes(row.device_peak_bytes)}, host {fmt_bytes(row.host_bytes)}, bound by {row.bottleneck}; "
        "--no-search runs the defaults")
    return new, machine


def step_at_run_split(model, policy, hw, step_s: float, device: str, compute_threads) -> tuple[float, str]:
    """(the chosen policy's predicted step at the core split the run will take, what to say of
    it): the search ranks every candidate on the description's own split (as `tune` does); on
    the CPU backend with --compute-threads auto the run then takes the planner's split for the
    chosen Schedule, and its 'plan:' line predicts at that split, so this line does too."""
    if device != "cpu" or compute_threads not in (None, "auto"):
        return step_s, ""
    from horizon_sim.plan.core_split import priced_for_split
    from horizon_sim.plan.plan import build_for
    _, split = priced_for_split(build_for(model, policy, hw), hw, "auto")
    if split is None:
        return step_s, ""
    return split.step_s, f" on {split.compute_threads} compute thread(s)"  # the chosen count's simulated step


def _hardware_file(path):
    from horizon_sim.job.toml import load_hardware_or_job
    return load_hardware_or_job(path)

