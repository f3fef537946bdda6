"""plan(): build the schedule for (model, policy) and simulate it on the hardware."""
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.simulate import SimResult, simulate_policy
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.layout import ONE, Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def plan(model: ModelSpec | str, hardware: HardwareSpec | None = None, policy: Policy | None = None,
         *, gpu: str = "h100-sxm", ram: str | int = "512GiB", link: str | None = None,
         layout: Layout = ONE) -> SimResult:
    """Predict one training step. `model` is a ModelSpec, a preset name or a config.json path;
    give `hardware`, or `gpu`/`ram`/`link` preset names and a RAM size (per node), and the
    `layout`, devices per node x nodes (data parallel: each device runs policy.batch sequences)."""
    spec = load_model(model) if isinstance(model, str) else model
    hw = hardware or make_hardware(gpu, ram, link, layout=layout)
    return simulate_policy(spec, policy or Policy(), hw)


def build_for(model: ModelSpec, policy: Policy, hw: HardwareSpec):
    """The Schedule of one step of `model` under `policy` on `hw`'s data-parallel layout."""
    return build_schedule(model, policy, hw.cluster.layout)


def scaling_efficiency(r: SimResult) -> float | None:
    """tokens/s of the job / (ranks x tokens/s of the same step on one device), or None for one
    device."""
    if r.summary.ranks == 1:
        return None
    from dataclasses import replace

    from horizon_sim.specs.cluster import SINGLE
    one = simulate_policy(r.schedule.meta.model, r.policy, replace(r.hardware, cluster=SINGLE))
    return r.summary.tokens_per_s / (r.summary.ranks * one.summary.tokens_per_s)
