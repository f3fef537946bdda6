"""The search space left by the policy flags a user gave: each knob a flag set keeps that one
value, the planner searches the others (issue 39, item 4). `horizon tune` and `horizon train`
without a full policy both build their space here, so train's default policy is the row tune
ranks first for the same model, flags and machine.

    space = pinned_space(policy_from_args(a), given, n_layers=model.n_layers, batch=a.batch)
    tune(model, hw, policy.seq, base=policy, space=space).best

`given` holds the argparse dests of the flags on the command line (cli/explicit_flags.py).
What is not a knob (the batch and sequence when fixed, the precisions, clipping, the disk tier,
document masks) is the base policy's and never searched."""
from collections.abc import Iterable

from horizon_sim.plan.tune import SearchSpace
from horizon_sim.specs.policy import Policy

KNOB_FLAGS = {"micro_batches": "--micro-batches", "act_ckpt_every": "--act-ckpt-every",
              "keep_last": "--keep-activations", "slots": "--slots", "act_ckpt_on": "--act-ckpt-on",
              "optimizer": "--optimizer", "working_copy": "--no-working-copy", "split_master": "--master-dtype",
              "max_host_grads": "--max-host-grads", "mb_order": "--mb-order", "adapters_on": "--adapters-on"}
"""Each knob the planner searches, and the policy flag that pins it."""
KNOB_DESTS = {"micro_batches": "micro_batches", "act_ckpt_every": "act_ckpt_every", "keep_last": "keep_activations",
              "slots": "slots", "act_ckpt_on": "act_ckpt_on", "optimizer": "optimizer",
              "working_copy": "no_working_copy", "split_master": "master_dtype", "max_host_grads": "max_host_grads",
              "mb_order": "mb_order", "adapters_on": "adapters_on"}
"""Knob -> the argparse dest of its flag."""


def pinned_knobs(given: Iterable[str]) -> tuple[str, ...]:
    """The knobs the flags `given` (dests) pin."""
    g = set(given)
    return tuple(k for k, d in KNOB_DESTS.items() if d in g)


def pinned_space(policy: Policy, given: Iterable[str], *, n_layers: int, batch: int | None = None,
                 max_batch: int = 64, no_split: bool = False) -> SearchSpace:
    """The SearchSpace of `policy`'s knobs with each one a flag in `given` set (dests) pinned to
    the policy's value. batch: sequences per step, fixed (None: any up to max_batch).
    no_split: the split master is out (this executor cannot run it here: no native kernel).
    A bound on the host gradients (--max-host-grads N > 0) applies to the optimizer in backward
    with one micro-batch only, which the policy then has: those are pinned with it."""
    pins = set(pinned_knobs(given))
    p = policy
    if p.adapters:  # a frozen base has no host update: these knobs have nothing to act on
        pins |= {"optimizer", "working_copy", "split_master", "max_host_grads"}
    if p.max_host_grads and "max_host_grads" in pins:
        pins |= {"optimizer", "micro_batches"}
    if "split_master" in pins and p.split_master:
        pins.add("working_copy")  # the split master's high half is the working copy
    if "working_copy" in pins and not p.working_copy:
        pins.add("split_master")  # no copy, no split
    values = {"micro_batches": (p.micro_batches,), "act_ckpt_every": (min(p.act_ckpt_every, n_layers),),
              "keep_last": (p.kept_layers(n_layers),),
              "slots": (p.slots,), "act_ckpt_on": (p.act_ckpt_on,), "optimizer": (p.optimizer,),
              "working_copy": (p.working_copy,), "split_master": (bool(p.split_master),),
              "max_host_grads": (p.max_host_grads,), "mb_order": (p.mb_order,), "adapters_on": (p.adapters_on,)}
    kw = {k: values[k] for k in pins}
    if no_split and "split_master" not in pins:
        kw["split_master"] = (False,)
    if "max_host_grads" in pins and p.max_host_grads:
        kw["bound_pinned"] = True
    return SearchSpace(**kw, batch=batch, max_batch=batch or max_batch)
