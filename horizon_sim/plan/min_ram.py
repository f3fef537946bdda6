"""min_ram(): the smallest host RAM, in 64 GiB steps, that a (model, device, policy) fits in.

The host footprint does not depend on how much RAM is installed, so one simulation gives it;
the answer is footprint + the OS reserve, rounded up to a multiple of 64 GiB. It is then
checked by simulating on a host of that size (it must fit) and of 64 GiB less (it must not).
"""
from dataclasses import dataclass, replace

from horizon_sim.errors import HorizonError
from horizon_sim.plan.outcome import RAM_STEP_BYTES, round_up_ram, simulate_outcome
from horizon_sim.sim.simulate import SimResult, simulate_policy
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB, fmt_bytes


@dataclass(frozen=True)
class MinRamResult:
    ram_bytes: int
    """Smallest installed RAM that fits, a multiple of `step_bytes`."""
    step_bytes: int
    host_bytes: int
    """The host footprint (process runtime included)."""
    os_reserved_bytes: int
    breakdown: dict
    """Host bytes per role at the footprint's peak: master, moments, working_copy, grads, ..."""
    result: SimResult
    """The simulation on a host with `ram_bytes` of RAM (fits)."""
    below: SimResult | None
    """The simulation with `step_bytes` less RAM (does not fit); None when that is no host."""

    @property
    def tokens_per_s(self) -> float:
        return self.result.summary.tokens_per_s


def _with_ram(hw: HardwareSpec, ram_bytes: int) -> HardwareSpec:
    return replace(hw, host=replace(hw.host, ram_GiB=ram_bytes / GiB),
                   name=f"{hw.device.name} / {hw.link.name} / {hw.host.name} host, {fmt_bytes(ram_bytes)} RAM")


def min_ram(model: ModelSpec, hw: HardwareSpec, policy: Policy | None = None, *,
            step_bytes: int = RAM_STEP_BYTES) -> MinRamResult:
    """The smallest RAM (a multiple of `step_bytes`) with which `model` under `policy` fits on
    `hw`'s device, link and host type; `hw`'s own RAM size is ignored. Raises HorizonError when
    the device memory is short (no RAM size helps)."""
    policy = policy or Policy()
    if isinstance(step_bytes, bool) or not isinstance(step_bytes, int) or step_bytes <= 0:
        raise HorizonError(f"step_bytes={step_bytes!r} must be a positive integer")
    out = simulate_outcome(model, hw, policy)
    if not out.ok:  # a bad policy for this model (K > layers, ...)
        raise HorizonError(out.error)
    if not out.fits_device(hw):
        raise HorizonError(
            f"no amount of host RAM fits {model.name} on {hw.device.name}: the device needs "
            f"{fmt_bytes(out.device_peak_bytes)} of {fmt_bytes(hw.device_bytes_usable)} usable "
            f"(short by {fmt_bytes(out.device_peak_bytes - hw.device_bytes_usable)}); try --act-ckpt-on host, "
            "a larger --act-ckpt-every, more --micro-batches or a smaller --batch")
    ram = round_up_ram(out.ram_needed_bytes(hw), step_bytes)
    for _ in range(3):  # float rounding of GiB sizes could leave a byte short: step up
        at = simulate_policy(model, policy, _with_ram(hw, ram))
        if at.summary.fits:
            break
        ram += step_bytes
    else:
        raise HorizonError(f"{model.name}: no RAM size up to {fmt_bytes(ram)} fits; the simulator disagrees "
                           f"with the footprint ({at.summary.why})")
    below = None
    if ram - step_bytes > hw.host.os_reserved_GiB * GiB:
        below = simulate_policy(model, policy, _with_ram(hw, ram - step_bytes))
        if below.summary.fits:  # cannot happen: the footprint is the same for every RAM size
            raise HorizonError(f"{model.name}: fits in {fmt_bytes(ram - step_bytes)} although the footprint "
                               f"says {fmt_bytes(ram)}; please report this")
    return MinRamResult(ram_bytes=ram, step_bytes=step_bytes, host_bytes=at.summary.host_bytes,
                        os_reserved_bytes=int(hw.host.os_reserved_GiB * GiB), breakdown=dict(at.host.by_role),
                        result=at, below=below)
