"""Node admission: before a data-parallel launch starts any rank, does the whole node fit?

Each rank's own admission (runtime/admission.py) runs only once the ranks are up and have
joined: a `--nproc-per-node 1000` on a 2-core, 24 GB machine had by then started its ranks,
filled the RAM (the OOM killer took unrelated processes) and left hundreds of processes to
clean up. So the launcher checks first, in this process, with nothing started:

- cores: more ranks than CPU cores (os.cpu_count) is refused unless --oversubscribe: every
  rank runs its lanes' threads on its share of the cores (dist/context.py core_share), and a
  rank with no core of its own makes every step wait for it.
- host RAM: N ranks x the per-rank footprint + the node's shared store (counted once: the
  ranks map one copy, dist/shared.py) against --host-budget, else MemAvailable + this
  process. The figures are the per-rank admission's own (admit() on the one-rank Schedule):
  the per-rank part is the process runtime (what a process holding torch holds now, plus
  RUNTIME_GROWTH_BYTES) and, on the CPU backend, its "device" memory; the rest is the store.
  --no-admission skips this part (not the cores check, which --oversubscribe lifts).
A refusal is a HorizonError: one line, exit 2, no process started.
"""
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from horizon_sim.errors import HorizonError
from horizon_sim.units import fmt_bytes

if TYPE_CHECKING:
    from horizon_exec.dist.launch import LaunchConfig
    from horizon_exec.train.config import RunConfig


@dataclass(frozen=True, slots=True)
class NodeNeed:
    ranks: int
    per_rank_bytes: int
    """What each rank's process holds on its own (runtime, CPU backend's device memory)."""
    shared_bytes: int
    """What the node holds once for all its ranks (the host store and its padding)."""

    @property
    def total_bytes(self) -> int:
        return self.ranks * self.per_rank_bytes + self.shared_bytes


def check_cores(ranks: int, oversubscribe: bool, cores: int | None = None) -> None:
    """Refuse more ranks than this node has CPU cores, unless the user insists."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if ranks > cores and not oversubscribe:
        raise HorizonError(f"--nproc-per-node {ranks}: this node has {cores} CPU core(s), at most {cores} "
                           f"rank(s) (one per core); fewer ranks, or --oversubscribe to run them anyway")


def node_need(cfg: "RunConfig", ranks: int) -> NodeNeed:
    """The node's host RAM need for `ranks` ranks of the run `cfg` (module docstring)."""
    import torch  # noqa: F401 - a rank holds torch: the runtime measured below must too

    from horizon_exec.runtime.admission import admit
    from horizon_sim.schedule import build_schedule
    from horizon_sim.specs.hf_config import load_model
    model = _model(cfg, load_model)
    policy = cfg.policy
    sched = build_schedule(model, policy)
    # a budget nothing exceeds: the figures are wanted, the verdict is decided here
    adm = admit(model, policy, sched, device="cpu", host_budget_bytes=2**62, advise=False)
    roles = adm.host_by_role
    on_cpu = cfg.trainer.runtime.device == "cpu"
    per_rank = roles.get("runtime", 0) + (roles.get("device_on_cpu_backend", 0) if on_cpu else 0)
    shared = adm.host_need_bytes - roles.get("runtime", 0) - roles.get("device_on_cpu_backend", 0)
    return NodeNeed(ranks, int(per_rank), int(shared))


def _model(cfg: "RunConfig", load_model):
    if cfg.init_from:
        from horizon_exec.checkpoints import hf_checkpoint
        return hf_checkpoint.spec_from_hf_dir(hf_checkpoint.resolve_checkpoint(cfg.init_from))
    return load_model(cfg.model)


def available_bytes(host_budget_bytes: int | None) -> tuple[int | None, str]:
    """(host RAM the node's ranks may use, where the figure comes from); None: unknown.
    host_budget_bytes: --host-budget's, as read (None: not given)."""
    from horizon_exec.procfs import mem_available_bytes, rss_bytes
    if host_budget_bytes is not None:
        return host_budget_bytes, "--host-budget"
    avail = mem_available_bytes()
    return (None, "") if avail is None else (avail + rss_bytes(), "MemAvailable + the launcher")


def check_node(cfg: "RunConfig", launch: "LaunchConfig") -> NodeNeed | None:
    """Refuse (HorizonError) a launch of `cfg` this node cannot hold, before any rank starts."""
    check_cores(launch.nproc_per_node, launch.oversubscribe)
    if not cfg.trainer.admission.enabled:
        return None
    need = node_need(cfg, launch.nproc_per_node)
    have, src = available_bytes(cfg.trainer.admission.host_budget_bytes)
    if have is not None and need.total_bytes > have:
        raise HorizonError(
            f"--nproc-per-node {need.ranks} does not fit this node's host RAM: {need.ranks} ranks x "
            f"{fmt_bytes(need.per_rank_bytes)} per rank + {fmt_bytes(need.shared_bytes)} shared store = "
            f"{fmt_bytes(need.total_bytes)}, {fmt_bytes(have)} available ({src}); at most "
            f"{max(0, (have - need.shared_bytes) // max(need.per_rank_bytes, 1))} rank(s) fit")
    return need
