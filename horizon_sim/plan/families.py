"""Schedule families by name: what builds a family's step, what policy it takes, how a Horizon
policy's batch becomes one of its policies, and what runs it for real. plan, tune, sweep, the
published suite and validate read this table, so a family is added here once (with its builder,
a StepBuilder subclass, and its name in schedule/op.py's Family; docs/architecture.md).

    fam = family("zero3-offload")
    r = fam.plan(model, hw, fam.like(policy, act_ckpt=False))
"""
from dataclasses import dataclass, fields, replace
from typing import Callable

from horizon_sim.errors import HorizonError
from horizon_sim.peer.compare import plan_zero3, zero2_like, zero3_like
from horizon_sim.peer.zero3_builder import build_zero3_schedule
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.plan.plan import plan
from horizon_sim.schedule import build_schedule
from horizon_sim.schedule.op import PEERS, Family
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.sim.simulate import SimResult
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.layout import ONE, Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import closest


@dataclass(frozen=True)
class ScheduleFamily:
    name: Family
    title: str
    """What users call it, for output ("DeepSpeed ZeRO-3 offload")."""
    policy_type: type
    build: Callable[..., Schedule]
    """(model, policy of policy_type, layout) -> the checked Schedule of one step."""
    plan: Callable[[ModelSpec, HardwareSpec, object], SimResult]
    """(model, hw, policy of policy_type) -> the simulated step on that machine."""
    like: Callable[..., object]
    """(Horizon Policy, **knobs) -> this family's policy on the same batch, knobs overriding."""
    runs_for_real: str
    """What runs the family's step on a real machine (the executor's refusal names it)."""

    @property
    def knobs(self) -> tuple[str, ...]:
        """The policy fields a user may set (--peer-knobs for a peer)."""
        return tuple(f.name for f in fields(self.policy_type))


def _horizon_build(model: ModelSpec, policy: Policy, layout: Layout = ONE) -> Schedule:
    return build_schedule(model, policy, layout)


def _zero3_build(model: ModelSpec, zero3: Zero3Policy, layout: Layout = ONE) -> Schedule:
    if layout != ONE:
        raise HorizonError(f"the {zero3.title} peer is modelled on one device, not {layout}")
    return build_zero3_schedule(model, zero3)


FAMILIES: dict[Family, ScheduleFamily] = {f.name: f for f in (
    ScheduleFamily(Family.HORIZON, "Horizon", Policy, _horizon_build, plan,
                   lambda policy, **knobs: replace(policy, **knobs), "horizon train"),
    ScheduleFamily(Family.ZERO3_OFFLOAD, "DeepSpeed ZeRO-3 offload", Zero3Policy, _zero3_build, plan_zero3,
                   zero3_like, "DeepSpeed itself, as horizon validate --peer zero3-offload does"),
    # the same policy and builder with the parameters on the GPU (Zero3Policy.offload_param off)
    ScheduleFamily(Family.ZERO2_OFFLOAD, "DeepSpeed ZeRO-2 offload", Zero3Policy, _zero3_build, plan_zero3,
                   zero2_like, "DeepSpeed itself (this project has not run ZeRO-2 offload)"),
)}

def family(name) -> ScheduleFamily:
    """The family called `name` (a Family or its name); a one-line error naming the known ones."""
    try:
        return FAMILIES[Family(name)]
    except ValueError:
        known = [f.value for f in FAMILIES]
        hint = closest(name, known) if isinstance(name, str) else ""
        raise HorizonError(f"unknown schedule family {name!r}{hint}; known: {', '.join(known)}") from None


def peer(name) -> ScheduleFamily:
    """The peer family called `name`: a family other than Horizon's."""
    if name not in PEERS:
        hint = closest(name, PEERS) if isinstance(name, str) else ""
        raise HorizonError(f"unknown peer {name!r}{hint}; allowed: {', '.join(PEERS)}")
    return family(name)
