"""Many simulations at once: the engine under tune, min-ram, max-model and advice, and
`horizon sweep`, a grid of models x hardware x policies (plan/grid.py).

A simulation's outcome (step time, device peak, host footprint) does not depend on how much
RAM the host has: RAM only decides whether the footprint fits. So every configuration is
simulated once per (model, device, link, host type, policy) and judged against each RAM size
afterwards. Simulations run on all cores (a fork pool), each under a time limit.
"""
import contextlib
import itertools
import math
import os
import signal
import sys
import threading
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from horizon_sim.errors import HorizonError
from horizon_sim.plan.grid import POLICY_FIELDS, Grid
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec
from horizon_sim.sim.verdict import MemoryVerdict
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB

MAX_MAP_ROWS = MAX_MAP_COLUMNS = 64
"""Models (rows) and RAM sizes (columns) the feasibility map draws: one labelled cell each,
about an inch wide, so a larger map would be an unreadable image of hundreds of megabytes."""
MAX_MAP_PANELS = 16
"""GPU x link panels of the map, side by side."""
RAM_STEP_BYTES = 64 * GiB
"""RAM is sold and reported here in multiples of 64 GiB."""
SIM_TIME_LIMIT_S = 2.0
SIM_TIME_PER_OP_S = 1e-3
"""A simulation that runs longer than SIM_TIME_LIMIT_S + SIM_TIME_PER_OP_S x ops (normal runs
take ~0.1 ms per op) is stopped and reported as an error, so one stuck configuration cannot
stall a search."""


# ---- one simulation ---------------------------------------------------------------------
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
        simulated: the footprint does not depend on it)."""
        return MemoryVerdict(host_need=dict(self.host_breakdown) or {"host": self.host_bytes},
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
        return self.host_bytes + int(math.ceil(hw.host.os_reserved_GiB * GiB))

    def why_not(self, hw: HardwareSpec) -> str:
        """One phrase: what does not fit and by how much ('' when it fits)."""
        return self.verdict(hw).short() if self.ok else self.error


def round_up_ram(nbytes: int, step: int = RAM_STEP_BYTES) -> int:
    """`nbytes` rounded up to a multiple of `step` (64 GiB)."""
    return max(1, -(-int(nbytes) // step)) * step


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
    """Build and simulate one step; a bad combination becomes an Outcome with `error` set."""
    try:
        sched = build_schedule(model, policy, hw.cluster.devices_per_node, hw.cluster.nodes)
    except HorizonError as e:
        return Outcome(error=str(e))
    limit = SIM_TIME_LIMIT_S + SIM_TIME_PER_OP_S * len(sched.ops)
    try:
        with _time_limit(limit):
            r = simulate(sched, hw)
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


def simulate_peer_outcome(model: ModelSpec, hw: HardwareSpec, policy: Policy) -> Outcome:
    """The ZeRO-3-offload peer on the same batch (horizon_sim/peer), as an Outcome; a layout or
    policy it does not take becomes an Outcome with `error` set."""
    from horizon_sim.peer.compare import plan_zero3, zero3_like
    try:
        r = plan_zero3(model, hw, zero3_like(policy))
    except HorizonError as e:
        return Outcome(error=str(e).splitlines()[0])
    return outcome_of(r)


def _task(args) -> Outcome:
    """(model, hw, policy) or (model, hw, policy, peer): Horizon's step, or the peer's."""
    if len(args) > 3 and args[3]:
        return simulate_peer_outcome(*args[:3])
    return simulate_outcome(*args[:3])


def _ram_free_key(model: ModelSpec, hw: HardwareSpec, policy: Policy, peer: str | None = None):
    host = tuple(getattr(hw.host, f.name) for f in fields(hw.host) if f.name != "ram_GiB")
    return model, hw.device, hw.link, host, hw.cluster, policy, peer


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class Runner:
    """Simulates (model, hardware, policy) configurations on all cores, each one once: results
    are cached by everything but the RAM size. One tqdm bar on stderr counts simulations."""

    def __init__(self, workers: int | None = None, progress: bool = False, desc: str = "simulating",
                 known_total: bool = False):
        """known_total: each run() call is the whole job (the bar shows a total); otherwise
        the bar only counts (a search does not know how many simulations it will need)."""
        self.workers = default_workers() if workers is None else int(workers)
        most = 4 * default_workers()  # simulations are CPU-bound: more processes only take memory
        if not 1 <= self.workers <= most:
            raise HorizonError(f"workers={workers!r}: this machine has {default_workers()} cores; "
                               f"allowed: 1..{most}")
        self.progress, self.desc, self.known_total = progress, desc, known_total
        self.cache: dict = {}
        self._pool = None
        self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()  # a worker stuck past its time limit must not block exit
            self._pool.join()
            self._pool = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _get_pool(self):
        if self._pool is None:
            import multiprocessing as mp
            method = "fork" if sys.platform.startswith("linux") else "spawn"
            self._pool = mp.get_context(method).Pool(self.workers)
        return self._pool

    def _tick(self, n_new: int):
        if not self.progress:
            return None
        if self._bar is None:
            from tqdm import tqdm

            class _Bar(tqdm):
                monitor_interval = 0  # no monitor thread: the pool may fork later

            self._bar = _Bar(total=0 if self.known_total else None, desc=self.desc, unit="sim",
                             file=sys.stderr, leave=False, dynamic_ncols=True)
        if self.known_total:
            self._bar.total += n_new
            self._bar.refresh()
        return self._bar

    def run(self, tasks) -> list[Outcome]:
        """Outcomes of [(model, hw, policy), ...] (or (model, hw, policy, peer) for a peer's
        step, e.g. 'zero3-offload'), in order."""
        tasks = list(tasks)
        keys = [_ram_free_key(*t) for t in tasks]
        todo: dict = {}
        for k, t in zip(keys, tasks):
            if k not in self.cache and k not in todo:
                todo[k] = t
        if todo:
            items = list(todo.items())
            parallel = self.workers > 1 and len(items) > 1
            pool = self._get_pool() if parallel else None
            bar = self._tick(len(todo))
            if not parallel:
                for k, t in items:
                    self.cache[k] = _task(t)
                    if bar is not None:
                        bar.update(1)
            else:
                it = pool.imap(_task, [t for _, t in items], chunksize=1)
                for (k, _), out in zip(items, it):
                    self.cache[k] = out
                    if bar is not None:
                        bar.update(1)
        return [self.cache[k] for k in keys]

    def one(self, model: ModelSpec, hw: HardwareSpec, policy: Policy) -> Outcome:
        return self.run([(model, hw, policy)])[0]


# ---- rows -------------------------------------------------------------------------------
RESULT_COLUMNS = ("model", "params", "gpu", "link", "host", "devices_per_node", "nodes", "ram_bytes",
                  *POLICY_FIELDS, "fits",
                  "step_time_s", "tokens_per_s", "mfu", "device_peak_bytes", "device_usable_bytes",
                  "host_bytes", "host_usable_bytes", "bottleneck", "error")


PEER_COLUMNS = ("peer_fits", "peer_tokens_per_s", "speedup", "peer_device_peak_bytes", "peer_host_bytes",
                "peer_bottleneck", "peer_error")
"""Added by sweep(compare=...): the peer on the same model, machine and batch."""


def peer_row(hw: HardwareSpec, ours: Outcome, peer: Outcome) -> dict:
    speed = ours.tokens_per_s / peer.tokens_per_s if ours.ok and peer.ok and peer.tokens_per_s else math.nan
    return {"peer_fits": peer.fits(hw), "peer_tokens_per_s": peer.tokens_per_s, "speedup": speed,
            "peer_device_peak_bytes": peer.device_peak_bytes, "peer_host_bytes": peer.host_bytes,
            "peer_bottleneck": peer.bottleneck, "peer_error": peer.error}


def outcome_row(model: ModelSpec, hw: HardwareSpec, policy_fields: dict, out: Outcome) -> dict:
    """One table row: what was simulated, and what it predicts on this machine."""
    return {"model": model.name, "params": model.total_params, "gpu": hw.device.name,
            "link": hw.link.name, "host": hw.host.name, "devices_per_node": hw.cluster.devices_per_node,
            "nodes": hw.cluster.nodes, "ram_bytes": int(round(hw.host.ram_GiB * GiB)),
            **{f: policy_fields.get(f) for f in POLICY_FIELDS}, "fits": out.fits(hw),
            "step_time_s": out.step_time_s, "tokens_per_s": out.tokens_per_s, "mfu": out.mfu,
            "device_peak_bytes": out.device_peak_bytes, "device_usable_bytes": hw.device_bytes_usable,
            "host_bytes": out.host_bytes, "host_usable_bytes": hw.host_bytes_usable,
            "bottleneck": out.bottleneck, "error": out.error}


# ---- running it -------------------------------------------------------------------------
def sweep(grid: Grid, *, workers: int | None = None, progress: bool = False,
          compare: str | None = None) -> pd.DataFrame:
    """One row per configuration of the grid (columns RESULT_COLUMNS). Invalid policies are
    rows with `error` set and fits False. compare='zero3-offload': the peer's step on the same
    model, machine and batch too (PEER_COLUMNS)."""
    hws = {}
    for gpu, link, host, (g, n), c in itertools.product(grid.gpus, grid.links, grid.hosts, grid.layouts,
                                                        grid.clusters):
        for ram in grid.ram:
            hws[gpu, link, host, g, n, c, ram] = make_hardware(gpu, ram, link, host, gpus=g, nodes=n, cluster=c)
    configs = []  # (model, hw, fields, policy or error)
    for model in grid.models:
        for fields_ in grid.policies():
            try:
                pol, err = Policy(**fields_), ""
            except (HorizonError, TypeError) as e:
                pol, err = None, str(e).splitlines()[0]
            for hw in hws.values():
                configs.append((model, hw, fields_, pol, err))
    runnable = [(m, hw, pol) for m, hw, _, pol, err in configs if pol is not None]
    peers = [(*t, compare) for t in runnable] if compare else []
    with Runner(workers, progress, desc="sweep", known_total=True) as runner:
        done = runner.run(runnable + peers)
    outs, peer_outs = iter(done[:len(runnable)]), iter(done[len(runnable):])
    rows = []
    for m, hw, fields_, pol, err in configs:
        out = next(outs) if pol is not None else Outcome(error=err)
        row = outcome_row(m, hw, fields_, out)
        if compare:
            row.update(peer_row(hw, out, next(peer_outs) if pol is not None else Outcome(error=err)))
        rows.append(row)
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS) + (list(PEER_COLUMNS) if compare else []))


OUTPUT_SUFFIXES = (".csv", ".parquet")


def check_output(path) -> Path:
    """Fail before simulating when the results cannot be written."""
    p = Path(path)
    if p.suffix.lower() not in OUTPUT_SUFFIXES:
        raise HorizonError(f"-o {str(p)!r}: the results file must end in .csv or .parquet")
    if p.is_dir():
        raise HorizonError(f"-o {str(p)!r} is a directory; give a file name like results.csv")
    if not p.parent.is_dir():
        raise HorizonError(f"-o {str(p)!r}: directory {str(p.parent)!r} does not exist")
    if p.suffix.lower() == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise HorizonError(f"-o {str(p)!r}: writing .parquet needs pyarrow (pip install pyarrow); "
                               f"or write {p.with_suffix('.csv').name}") from None
    return p


def write_results(df: pd.DataFrame, path) -> Path:
    p = check_output(path)
    if p.suffix.lower() == ".parquet":
        df.to_parquet(p, index=False)
    else:
        df.to_csv(p, index=False)
    return p


def check_map(grid: Grid) -> None:
    """Fail before simulating when the grid's feasibility map would be too big to draw."""
    panels = len(grid.gpus) * len(grid.links) * len(grid.layouts)
    for what, n, limit in (("models", len({m.name for m in grid.models}), MAX_MAP_ROWS),
                           ("RAM sizes", len(set(grid.ram)), MAX_MAP_COLUMNS),
                           ("GPU x link x layout panels", panels, MAX_MAP_PANELS)):
        if n > limit:
            raise HorizonError(f"the feasibility map draws at most {limit} {what}; the grid has {n}: "
                               "use --no-plot (the table has every row), or fewer values")


def map_path(results_path) -> Path:
    """Where the feasibility map goes: next to the results, same stem, .png."""
    p = Path(results_path)
    return p.with_name(p.stem + ".png")
