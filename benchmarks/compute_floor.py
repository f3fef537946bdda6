"""The least compute a training step of a model needs on this machine: its matrix products and
attention (forward once, backward once, nothing recomputed) at the kernel rates the machine's
description measured (its calibration, or --hardware), on the compute threads the run uses.
Any trainer of the same model, batch and dtype spends at least this on a step, so a measured
baseline step over this floor bounds how far any policy can beat that baseline: the ratio a
benchmark may ask for is reachable only where the baseline loses more than that to other work
(casts, page faults, a materialised loss). Elementwise kernels, the optimizer and fixed costs
are left out: they are the part a trainer's design can change.

    floor = compute_floor(spec, policy, hw, threads)   # Floor(seconds=4.4, why='')
"""
from dataclasses import dataclass, replace

from horizon_sim.errors import HorizonError
from horizon_sim.schedule.builder import build_schedule
from horizon_sim.schedule.op import OpKind
from horizon_sim.sim.costs import CostModel
from horizon_sim.specs.core_split import split_hardware
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import KEEP_ALL, Policy

_COMPUTE = (OpKind.FORWARD, OpKind.BACKWARD_SAVED, OpKind.HEAD)
"""A schedule in which every layer keeps its activations has exactly these compute ops: each
layer's forward once, its backward from what the forward saved, and the head's forward and
backward (asserted below, so a schedule with a recompute in it cannot pass for the floor)."""


@dataclass(frozen=True)
class Floor:
    seconds: float
    """GEMM and attention seconds of one step (0.0 when why is set)."""
    why: str = ""
    """Why there is no floor for this machine description ('' when there is)."""


def compute_floor(model: ModelSpec, policy: Policy, hw: HardwareSpec, threads: int) -> Floor:
    """The step's GEMM and attention seconds at `hw`'s measured rates on `threads` compute
    threads, for `policy`'s batch, sequence, dtype and loss chunking with every layer keeping
    its activations and one micro-batch (no recompute, one pass of each weight's GEMMs)."""
    try:
        priced = split_hardware(hw, threads)
    except HorizonError as e:
        return Floor(0.0, str(e))
    minimal = replace(policy, keep_last=KEEP_ALL, micro_batches=1, act_ckpt_every=1)
    sched = build_schedule(model, minimal)
    costs = CostModel(priced, minimal.compute_dtype, sched.meta)
    seconds = 0.0
    for op in sched.ops:
        if op.kind in (OpKind.RECOMPUTE, OpKind.BACKWARD):
            raise AssertionError(f"the floor's schedule recomputes ({op.kind.value}): it is not the least work")
        if op.kind in _COMPUTE:
            terms = costs.compute_terms(op)
            seconds += terms["gemm"] + terms["attention"]
    return Floor(seconds)
