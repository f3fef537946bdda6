"""DistContext: who this process is in a data-parallel run, and its process groups.

Ranks are numbered node-major, as torchrun numbers them: rank = node * N + local_rank (N
devices per node, M nodes). A rank runs the same Schedule as every other (one rank's step) on
its own share of the global batch.

Each lane that runs collectives has process groups of its own, and only that lane's thread uses
them: a process group runs its collectives in the order they are issued, every rank issues a
lane's ops in the Schedule's order, so the order matches across ranks whatever the timing
between lanes. Groups per use:
  fabric     the node's ranks, the fabric lane's device reduce-scatter (NCCL on CUDA, else gloo)
  fabric_host  the node's ranks, the fabric lane's sums of host tensors (adapters on the host) (gloo)
  host       the node's ranks, the CPU lane's reduce of host-accumulated gradients (gloo)
  node_net   the node's ranks, the net lane's update barrier (gloo)
  cross      the ranks with this local rank on every node, the net lane's reduce-scatter and
             all-gather of host shards (gloo)
  world_net  every rank, the net lane's norm all-reduce (gloo)
  main       every rank, the calling thread's (step token counts, eval sums, barriers around
             initialisation and checkpoints): the default group (gloo)
A collective that a dead or stuck peer never joins fails after `timeout_s` (the process
group's timeout), naming this rank and the op; the engine's op timeout can end it sooner.
"""
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta

from horizon_sim.errors import HorizonError
from horizon_sim.specs.layout import ONE, Layout

DEFAULT_TIMEOUT_S = 300.0
"""How long a collective waits for its peers before it fails (horizon train --dist-timeout)."""


@dataclass(frozen=True, slots=True)
class DistContext:
    rank: int
    local_rank: int
    node: int
    layout: Layout
    """The run's ranks: devices per node x nodes."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    cores: tuple = ()
    """CPU backend: the cores this process was pinned to when it joined (its share of the node's,
    cores_of), which every thread it started since inherits; () when not pinned."""
    groups: dict = field(default_factory=dict, compare=False, repr=False)
    """name -> process group (module docstring); empty when world == 1."""

    @property
    def world(self) -> int:
        """Every rank of the run."""
        return self.layout.ranks

    @property
    def is_leader(self) -> bool:
        """Local rank 0: the process that initialises and writes the node's shared state."""
        return self.local_rank == 0

    @property
    def shm_tag(self) -> str:
        """Names the node's shared store: one per run (the rendezvous) and node."""
        job = os.environ.get("TORCHELASTIC_RUN_ID", "") or os.environ.get("MASTER_PORT", "0")
        return f"horizon-{job}-{os.environ.get('MASTER_ADDR', 'local')}-n{self.node}"

    def close(self, wait: bool = True) -> None:
        """End this process's part in the run: with `wait`, once every rank got here (so no rank
        tears its connections down under a peer still using them), then the process groups go
        (their threads stopped: a process that exits with them alive aborts). Idempotent."""
        if self.world == 1:
            return
        import torch.distributed as dist
        if not dist.is_initialized():
            return
        try:
            if wait:
                dist.barrier(group=self.groups["main"])
        finally:
            dist.destroy_process_group()

    def barrier(self) -> None:
        """Every rank reaches this point (the calling thread's group)."""
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier(group=self.groups["main"])


def single() -> DistContext:
    """The context of a run of one process."""
    return DistContext(0, 0, 0, ONE)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now: the rendezvous of ranks this machine
    starts for a measurement (validate, calibrate, benchmarks)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_rank(rc: int) -> None:
    """End a rank's process once its run is over and its groups are closed: flush the output,
    then leave without the interpreter's teardown. That teardown, after a clean close, aborted
    about 1 two-rank run in 8 here ('terminate called without an active exception', SIGABRT,
    in a rank that had closed: a native thread of torch.distributed still joinable at exit),
    and the launcher then reports a finished run as failed. A process of one rank exits as usual."""
    if not launched():
        from horizon_sim.cli.stuck_threads import exit_past_stuck_threads
        exit_past_stuck_threads(rc if isinstance(rc, int) else 1)  # a lane left in a kernel: no teardown
        sys.exit(rc)
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc if isinstance(rc, int) else 1)


def _env_int(name: str) -> int:
    v = os.environ.get(name)
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise HorizonError(f"environment variable {name}={v!r}: a torch.distributed launcher sets it to an "
                           "integer (run through torchrun or horizon train --nproc-per-node)") from None
    return n


def launched() -> bool:
    """This process was started by a torch.distributed launcher with more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def from_env(device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join the run torchrun (or `horizon train --nproc-per-node`) started: env:// rendezvous
    from RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; makes
    the process groups. A run of one process gets single()."""
    if not launched():
        return single()
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
        raise HorizonError(f"--dist-timeout {timeout_s!r} must be a positive number of seconds")
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank, n = _env_int("LOCAL_RANK"), _env_int("LOCAL_WORLD_SIZE")
    if world % n or not 0 <= rank < world or not 0 <= local_rank < n:
        raise HorizonError(f"ranks: RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={n}: "
                           "every node must run the same number of processes")
    from horizon_exec.dist import watchdog
    watchdog.start()  # a launcher killed outright takes this rank with it (watchdog.py)
    import torch.distributed as dist
    t = timedelta(seconds=timeout_s)
    cores = _pin_share(local_rank, n) if device == "cpu" and n > 1 else ()
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=t)
    m = world // n
    node = rank // n
    device_backend = "nccl" if device.startswith("cuda") else "gloo"
    groups = {"main": dist.group.WORLD}
    # new_group is collective: every rank creates every group, in the same order
    for j in range(m):
        ranks = list(range(j * n, (j + 1) * n))
        made = {k: dist.new_group(ranks, timeout=t, backend=b)
                for k, b in (("fabric", device_backend), ("fabric_host", "gloo"), ("host", "gloo"), ("node_net", "gloo"))}
        if j == node:
            groups.update(made)
    for i in range(n):
        g = dist.new_group([j * n + i for j in range(m)], timeout=t, backend="gloo")
        if i == local_rank:
            groups["cross"] = g
    groups["world_net"] = dist.new_group(list(range(world)), timeout=t, backend="gloo")
    return DistContext(rank, local_rank, node, Layout(n, m), float(timeout_s), cores, groups)


def _pin_share(local_rank: int, n: int) -> tuple:
    """Pin this thread, before the process groups start theirs, to this local rank's share of
    the cores: every thread started after inherits it. gloo's loop threads do a collective's
    reductions and copies; left on every core, one rank's land on its neighbour's core and slow
    that rank's compute (measured: the second of two ranks' backward 25-40% slower), and a
    step waits for its slowest rank. Best effort: () where the platform refuses."""
    try:
        share = core_share(local_rank, n, sorted(os.sched_getaffinity(0)))
        os.sched_setaffinity(0, share)
    except (AttributeError, OSError):
        return ()
    return tuple(share)


def cores_of(ctx: DistContext, cores: list[int]) -> list[int]:
    """The CPU cores this rank's lanes may use when the node's ranks share one CPU (the CPU
    backend): the share it was pinned to at join, else its share of `cores`."""
    return list(ctx.cores) or core_share(ctx.local_rank, ctx.layout.devices_per_node, cores)


def core_share(local_rank: int, n: int, cores: list[int]) -> list[int]:
    """An equal, disjoint share of `cores` per local rank of n (at least one core each)."""
    if n == 1:
        return cores
    k = max(1, len(cores) // n)
    share = cores[local_rank * k:(local_rank + 1) * k]
    return share or [cores[local_rank % len(cores)]]


def agree(ctx: DistContext, fn):
    """fn() on every rank; when it raises on any rank, every rank raises (the failing one its
    own error, the others a HorizonError naming that rank's), so no rank goes on to a
    collective the failed one will never join. One rank: fn()."""
    if ctx.world == 1:
        return fn()
    import torch.distributed as dist
    err, out = None, None
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - re-raised below, after every rank has heard
        err = e
    msgs = [None] * ctx.world
    dist.all_gather_object(msgs, f"{type(err).__name__}: {err}" if err is not None else "", group=ctx.groups["main"])
    if err is not None:
        raise err
    bad = [(r, m) for r, m in enumerate(msgs) if m]
    if bad:
        r, m = bad[0]
        raise HorizonError(f"rank {r} failed: {m.splitlines()[0] if m else m}")
    return out
