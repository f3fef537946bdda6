"""Where a CPU backend's cores go for one Schedule: the planner simulates the step at each
compute thread count the hardware file prices (specs/core_split.py: measured rows, else
estimates) and takes the fastest predicted step; ties go to more compute threads. A step whose
lanes idle lends their cores to compute (its speed with every core outweighs the slowdown while
a lane op runs beside it); a step whose lanes are busy (a large optimizer, many host copies)
keeps them their own cores, since compute sharing a core with a busy lane thread runs at the
pace of its slowest thread.

    split = choose_split(sched, hw)   # CoreSplit(compute_threads=2, cores=2, ...)
    split.line()                      # what was chosen and why, for logs and benchmarks
"""
from dataclasses import dataclass

from horizon_sim.schedule.op import Lane
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.specs.core_split import split_hardware, thread_speeds
from horizon_sim.specs.hardware import HardwareSpec

HOST_LANES = (Lane.H2D, Lane.D2H, Lane.CPU, Lane.FABRIC, Lane.NET)
"""The lanes whose ops run on host threads on the CPU backend (its link is CPU copies, its
collectives gloo threads): the lanes that need cores of their own or share compute's."""


@dataclass(frozen=True, slots=True)
class SplitPrice:
    """One candidate split as the planner predicts it."""
    compute_threads: int
    step_s: float
    lane_cores_busy: float
    """Host-lane busy seconds over the step: how many cores' worth of lane work it has."""


@dataclass(frozen=True, slots=True)
class CoreSplit:
    """The chosen split and every candidate's price."""
    compute_threads: int
    cores: int
    prices: tuple
    """SplitPrice per candidate, fewest threads first."""
    measured: bool
    """The file measured the compute lane at each count (else ideal-scaling estimates)."""

    @property
    def step_s(self) -> float:
        return next(p.step_s for p in self.prices if p.compute_threads == self.compute_threads)

    def line(self) -> str:
        cands = ", ".join(f"{p.compute_threads}: {p.step_s * 1e3:.0f} ms" for p in self.prices)
        busy = self.prices[-1].lane_cores_busy
        return (f"compute on {self.compute_threads} of {self.cores} core(s), lanes "
                f"{'on the rest' if self.compute_threads < self.cores else 'sharing them'} (predicted step by "
                f"compute threads: {cands}; lanes busy {busy:.2f} cores' worth; "
                f"{'measured' if self.measured else 'estimated'} thread scaling)")


def lane_cores_busy(tl) -> float:
    """Cores' worth of host-lane work in a timeline: busy seconds of HOST_LANES over the step."""
    step = float(tl.end_s.max()) if len(tl) else 0.0
    busy = float(tl[tl.lane.isin([lane.value for lane in HOST_LANES])].dur_s.sum())
    return busy / step if step > 0 else 0.0


def price_split(sched: Schedule, hw: HardwareSpec, threads: int) -> SplitPrice:
    """The predicted step of `sched` with `threads` compute threads."""
    from horizon_sim.sim.simulate import run_timeline  # the simulator imports the specs
    tl = run_timeline(sched, split_hardware(hw, threads))
    return SplitPrice(threads, float(tl.end_s.max()), lane_cores_busy(tl))


def choose_split(sched: Schedule, hw: HardwareSpec) -> CoreSplit:
    """The fastest predicted split of `hw`'s cores for `sched` (module docstring)."""
    speeds = thread_speeds(hw)
    prices = tuple(price_split(sched, hw, t) for t in sorted(speeds))
    best = min(prices, key=lambda p: (p.step_s, -p.compute_threads))
    return CoreSplit(best.compute_threads, hw.host.cores, prices, all(s.measured for s in speeds.values()))


AUTO = "auto"


def threads_setting(text: str) -> int | str:
    """A --compute-threads value as `plan` takes it: 'auto' or a positive thread count."""
    from horizon_sim.errors import HorizonError
    t = str(text).strip().lower()
    if t == AUTO:
        return AUTO
    if t.isdigit() and int(t) > 0:
        return int(t)
    raise HorizonError(f"--compute-threads {text!r}: use 'auto' (the planner picks, as `horizon train` does) "
                       "or a positive number of threads")


def priced_for_split(sched: Schedule, hw: HardwareSpec, setting) -> tuple[HardwareSpec, CoreSplit | None]:
    """The hardware `plan` prices `sched` on, and the split chosen: on a calibrated CPU-backend
    file of one rank, `setting` 'auto' takes choose_split's pick (what `horizon train` runs by
    default) and N prices N threads; a GPU file, a data-parallel layout (each rank keeps cores - 1
    of its share, as the executor does) or a one-core machine is priced as it is (None)."""
    from horizon_sim.errors import HorizonError
    from horizon_sim.specs.cpu_ranks import is_cpu_backend
    cpu = is_cpu_backend(hw) and hw.cluster.ranks == 1 and hw.host.cores >= 2
    if not cpu:
        if setting not in (None, AUTO):
            raise HorizonError(f"--compute-threads {setting}: only a CPU-backend hardware file of one rank "
                               "(`horizon calibrate`'s, 2 or more cores) splits its cores; this machine has none to split")
        return hw, None
    split = choose_split(sched, hw)
    threads = split.compute_threads if setting in (None, AUTO) else setting
    return split_hardware(hw, threads), split if threads == split.compute_threads else \
        CoreSplit(threads, split.cores, split.prices, split.measured)
