"""The host DRAM bus as a SimPy resource shared by concurrent flows (DMA copies, the CPU
optimizer, host gathers). Bandwidth is split max-min fairly: each flow gets an equal share of
what is left, but never more than its own cap (a PCIe link, the optimizer's compute rate).

Host cores: flows marked `core` are CPU-thread work (the optimizer, host gathers, and copies
when the link is emulated by CPU threads). When `lane_cores` > 0 they share that many cores by
processor sharing: with k such flows active, each runs at min(1, lane_cores / k) of its own
cap (what an OS scheduler does to k busy threads on fewer cores). The core share is applied
first, then the bus split.

Rates are recomputed whenever a flow starts or ends (a fluid model, exact for this sharing).
`changed` fires at each such instant and `core_busy()` says whether CPU-thread work is
running, so the compute lane can slow down while it is (HostSpec.compute_contention)."""
import math

import simpy

_EPS_BYTES = 1e-3


class DramBus:
    def __init__(self, env: simpy.Environment, capacity_Bps: float, lane_cores: float = 0.0):
        self.env = env
        self.capacity_Bps = capacity_Bps
        self.lane_cores = lane_cores
        self._flows: dict[int, list] = {}  # id -> [remaining bytes, cap, done event, core]
        self._rates: dict[int, float] = {}
        self._next_id = 0
        self._last_t = 0.0
        self._wake = env.event()
        self.changed = env.event()
        env.process(self._run())

    def core_busy(self) -> bool:
        """Is CPU-thread work (a `core` flow) streaming right now?"""
        return any(f[3] for f in self._flows.values())

    def _notify(self) -> None:
        self.changed.succeed()
        self.changed = self.env.event()

    def transfer(self, nbytes: float, cap_Bps: float, core: bool = False) -> simpy.Event:
        """An event that fires when `nbytes` have streamed through the bus (`core`: the flow is
        CPU-thread work sharing the host lane cores)."""
        done = self.env.event()
        if nbytes <= 0:
            done.succeed()
            return done
        self._advance()
        self._flows[self._next_id] = [float(nbytes), cap_Bps, done, core]
        self._next_id += 1
        if core:
            self._notify()
        if not self._wake.triggered:
            self._wake.succeed()
        return done

    def _cap(self, flow, n_core: int) -> float:
        _, cap, _, core = flow
        if core and self.lane_cores > 0 and n_core > self.lane_cores:
            return cap * self.lane_cores / n_core
        return cap

    def _allocate(self) -> None:
        n_core = sum(1 for f in self._flows.values() if f[3])
        caps = {fid: self._cap(f, n_core) for fid, f in self._flows.items()}
        left, flows = self.capacity_Bps, sorted(caps.items(), key=lambda kv: (kv[1], kv[0]))
        self._rates = {}
        for i, (fid, cap) in enumerate(flows):
            r = min(cap, left / (len(flows) - i))
            self._rates[fid] = r
            left -= r

    def _advance(self) -> None:
        dt = self.env.now - self._last_t
        self._last_t = self.env.now
        if dt > 0:
            for fid, f in self._flows.items():
                f[0] -= self._rates.get(fid, 0.0) * dt

    def _run(self):
        while True:
            if not self._flows:
                yield self._wake
                self._wake = self.env.event()
                continue
            self._allocate()
            dt = min(f[0] / self._rates[fid] for fid, f in self._flows.items())
            if self.env.now + dt <= self.env.now:
                # Too short for the float clock at this time: step one ulp, or the flow would
                # never make progress and the simulation would spin forever.
                dt = math.ulp(self.env.now)
            yield self.env.timeout(max(dt, 0.0)) | self._wake
            if self._wake.triggered:
                self._wake = self.env.event()
            self._advance()
            core_ended = False
            for fid in [fid for fid, f in self._flows.items() if f[0] <= _EPS_BYTES]:
                flow = self._flows.pop(fid)
                flow[2].succeed()
                core_ended |= flow[3]
            if core_ended:
                self._notify()
