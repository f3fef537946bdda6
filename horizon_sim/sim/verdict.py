"""MemoryVerdict: the one answer to "does it fit", for the planner (plan, simulate, tune,
min-ram, max-model, sweep) and the executor's admission alike.

For each memory (host RAM, device memory): what the run needs, by role, against what is
usable there (None: not limited). A verdict knows whether each fits, by how much it is short,
and says so in one line.
"""
from dataclasses import dataclass, field

from horizon_sim.units import fmt_bytes


@dataclass(frozen=True, slots=True)
class MemoryVerdict:
    host_need: dict = field(default_factory=dict)
    """Host bytes the run needs, by role (master, moments, ..., runtime)."""
    host_usable: int | None = None
    """Host RAM the run may use (installed less the OS reserve, a budget, MemAvailable); None: not limited."""
    device_need: dict = field(default_factory=dict)
    """Device bytes the run needs at most, by role (weight slots, activations, ...)."""
    device_usable: int | None = None
    disk_need: int = 0
    """Local disk bytes the disk tier fills (0: no state on disk)."""
    disk_usable: int | None = None
    host_source: str = ""
    """Where host_usable comes from, for messages (e.g. 'MemAvailable 20 GiB + this process')."""
    device_source: str = ""

    @property
    def host_need_bytes(self) -> int:
        return int(sum(self.host_need.values()))

    @property
    def device_need_bytes(self) -> int:
        return int(sum(self.device_need.values()))

    @property
    def host_short_bytes(self) -> int:
        """How much host memory is missing (0 when it fits)."""
        return 0 if self.host_usable is None else max(0, self.host_need_bytes - self.host_usable)

    @property
    def device_short_bytes(self) -> int:
        return 0 if self.device_usable is None else max(0, self.device_need_bytes - self.device_usable)

    @property
    def disk_need_bytes(self) -> int:
        return int(self.disk_need)

    @property
    def disk_short_bytes(self) -> int:
        return 0 if self.disk_usable is None or not self.disk_need else max(0, self.disk_need - self.disk_usable)

    @property
    def disk_fits(self) -> bool:
        return self.disk_short_bytes == 0

    @property
    def host_fits(self) -> bool:
        return self.host_short_bytes == 0

    @property
    def device_fits(self) -> bool:
        return self.device_short_bytes == 0

    @property
    def fits(self) -> bool:
        return self.host_fits and self.device_fits and self.disk_fits

    def shortfall(self) -> float:
        """Need over usable of the tighter memory (<= 1 when it fits)."""
        ratios = [need / usable for need, usable in ((self.host_need_bytes, self.host_usable),
                                                     (self.device_need_bytes, self.device_usable))
                  if usable]
        if self.disk_need:
            ratios.append(self.disk_need / self.disk_usable if self.disk_usable else float("inf"))
        return max(ratios, default=0.0)

    def short(self) -> str:
        """One phrase: what does not fit and by how much ('' when it fits)."""
        out = []
        if not self.device_fits:
            out.append(f"device short by {fmt_bytes(self.device_short_bytes)}")
        if not self.host_fits:
            out.append(f"host short by {fmt_bytes(self.host_short_bytes)}")
        if not self.disk_fits:
            out.append(f"disk short by {fmt_bytes(self.disk_short_bytes)}")
        return ", ".join(out)

    def line(self) -> str:
        """Needed against usable for both memories, in one line."""
        def part(what, need, usable, src):
            src = f" ({src})" if src else ""
            if usable is None:
                return f"{what} needs {fmt_bytes(need)}{src}"
            verdict = (f", {fmt_bytes(usable - need)} to spare" if need <= usable
                       else f", short by {fmt_bytes(need - usable)}")
            return f"{what} needs {fmt_bytes(need)} of {fmt_bytes(usable)} usable{src}{verdict}"
        parts = [part("device", self.device_need_bytes, self.device_usable, self.device_source),
                 part("host", self.host_need_bytes, self.host_usable, self.host_source)]
        if self.disk_need:
            parts.append(part("disk", self.disk_need_bytes, self.disk_usable, ""))
        return "; ".join(parts)

    def breakdown(self) -> list[str]:
        def fmt(roles):
            return ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in roles.items() if v)
        return [f"host:   {fmt(self.host_need)}", f"device: {fmt(self.device_need)}"]
