"""One simulation's prediction (Outcome), whatever the host's RAM, and how one is made: a step
built and simulated under a time limit, a bad combination an Outcome with its error."""
import contextlib
import math
import signal
import threading
from dataclasses import dataclass

from horizon_sim.errors import HorizonError
from horizon_sim.schedule.limits import OPS_PER_PASS, layer_passes
from horizon_sim.sim.simulate import simulate_policy
from horizon_sim.sim.verdict import MemoryVerdict
from horizon_sim.specs.cpu_ranks import is_cpu_backend
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB

RAM_STEP_BYTES = 64 * GiB
"""RAM is sold and reported here in multiples of 64 GiB."""
SIM_TIME_LIMIT_S = 2.0
SIM_TIME_PER_OP_S = 1e-3
"""A simulation that runs longer than SIM_TIME_LIMIT_S + SIM_TIME_PER_OP_S x the step's ops
(limits.OPS_PER_PASS a layer pass; normal runs take ~0.1 ms per op) is stopped and reported as an error, so one stuck configuration cannot
stall a search."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one simulation predicts for (model, machine, policy), whatever the host's RAM."""

    step_time_s: float = math.nan
    tokens_per_s: float = math.nan
    mfu: float = math.nan
    device_peak_bytes: int = 0
    host_bytes: int = 0
    """Host footprint at its peak, process runtime included."""
    host_breakdown: tuple = ()
    """(role, bytes) pairs of the host footprint: master, moments, working_copy, grads, ..."""
    bottleneck: str = ""
    disk_bytes: int = 0
    """Local disk the disk tier fills (0: none)."""
    error: str = ""
    """Why there is no prediction (an invalid policy, a simulation that did not finish)."""

    @property
    def ok(self) -> bool:
        return not self.error

    def verdict(self, hw: HardwareSpec) -> MemoryVerdict:
        """This prediction against `hw`'s memories (the host's RAM may differ from the one
        simulated: the footprint does not depend on it). On the executor's CPU backend the
        "device" is host RAM too: the host then also holds each rank's device peak (as the
        executor's admission counts it)."""
        host = dict(self.host_breakdown) or {"host": self.host_bytes}
        if is_cpu_backend(hw):
            host["device_on_cpu_backend"] = self.device_peak_bytes * hw.cluster.layout.devices_per_node
        return MemoryVerdict(host_need=host,
                             host_usable=int(hw.host_bytes_usable), device_need={"device": self.device_peak_bytes},
                             device_usable=int(hw.device_bytes_usable), disk_need=self.disk_bytes,
                             disk_usable=hw.disk_bytes_usable)

    def fits_device(self, hw: HardwareSpec) -> bool:
        return self.ok and self.verdict(hw).device_fits

    def fits_host(self, hw: HardwareSpec) -> bool:
        return self.ok and self.verdict(hw).host_fits

    def fits(self, hw: HardwareSpec) -> bool:
        return self.ok and self.verdict(hw).fits

    def shortfall(self, hw: HardwareSpec) -> float:
        """Need over what is usable, of the tighter memory (<= 1 when it fits)."""
        return self.verdict(hw).shortfall() if self.ok else math.inf

    def ram_needed_bytes(self, hw: HardwareSpec) -> int:
        """Installed RAM the host footprint needs on this host type (the OS reserve added)."""
        return self.verdict(hw).host_need_bytes + int(math.ceil(hw.host.os_reserved_GiB * GiB))

    def why_not(self, hw: HardwareSpec) -> str:
        """One phrase: what does not fit and by how much ('' when it fits)."""
        return self.verdict(hw).short() if self.ok else self.error


def round_up_ram(nbytes: int, step_bytes: int = RAM_STEP_BYTES) -> int:
    """`nbytes` rounded up to a multiple of `step_bytes` (64 GiB)."""
    return max(1, -(-int(nbytes) // step_bytes)) * step_bytes


class _SimTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise _SimTimeout after `seconds` (SIGALRM; only in a main thread, elsewhere unguarded)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum, frame):
        raise _SimTimeout()

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def simulate_outcome(model: ModelSpec, hw: HardwareSpec, policy: Policy) -> Outcome:
    """Build and simulate one step; a bad combination becomes an Outcome with `error` set. A
    step of many micro-batches is simulated as a few and extended (sim/extend.py): only those
    are built."""
    limit = SIM_TIME_LIMIT_S + SIM_TIME_PER_OP_S * OPS_PER_PASS * layer_passes(model.n_layers, policy.micro_batches)
    try:
        with _time_limit(limit):
            r = simulate_policy(model, policy, hw)
    except HorizonError as e:
        return Outcome(error=str(e))
    except _SimTimeout:
        return Outcome(error=f"simulation did not finish in {limit:.0f} s")
    return outcome_of(r)


def outcome_of(r) -> Outcome:
    """A SimResult's figures, as an Outcome."""
    s = r.summary
    return Outcome(step_time_s=s.step_time_s, tokens_per_s=s.tokens_per_s, mfu=s.mfu,
                   device_peak_bytes=s.device_peak_bytes, host_bytes=s.host_bytes,
                   host_breakdown=tuple(r.host.by_role.items()), bottleneck=s.bottleneck,
                   disk_bytes=s.memory.disk_need_bytes)
