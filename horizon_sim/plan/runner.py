"""Many simulations at once, the engine under tune, advice, max-model, sweep, the report and the
executor's admission: each configuration simulated once, on all cores (a fork pool).

A simulation's outcome (step time, device peak, host footprint) does not depend on how much
RAM the host has: RAM only decides whether the footprint fits. So every configuration is
simulated once per (model, device, link, host type, layout, policy) and judged against each RAM
size afterwards."""
import os
import sys
from dataclasses import fields

from horizon_sim.errors import HorizonError
from horizon_sim.plan.outcome import Outcome, simulate_outcome
from horizon_sim.plan.peers import check_peer, simulate_peer_outcome
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def _task(args) -> Outcome:
    """(model, hw, policy) for Horizon's step, or (model, hw, policy, peer) for the named peer's."""
    model, hw, policy, *peer = args
    if not peer or peer[0] is None:
        return simulate_outcome(model, hw, policy)
    return simulate_peer_outcome(peer[0], model, hw, policy)


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
        for peer in dict.fromkeys(t[3] for t in tasks if len(t) > 3 and t[3] is not None):
            check_peer(peer)  # here, before a worker starts on the rest
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
