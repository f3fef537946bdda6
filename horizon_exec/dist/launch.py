"""`horizon train --nproc-per-node N [--nnodes M --node-rank J --master-addr A --master-port P]`:
start the run's processes through torch.distributed's own launcher (torch.distributed.run, the
code behind torchrun: env:// rendezvous, a worker that fails takes the others down).

The workers run `horizon_exec.cli.train_cmd` as a module with the parent's parsed arguments
(HORIZON_TRAIN_ARGS: the JSON the CLI hands launch() as `worker_args`), so they train exactly what
the parent checked; plain `torchrun --nproc-per-node N -m horizon_exec.cli.train_cmd --model tiny
...` works as well. This module reads no flags: the CLI (cli/launch_flags.py) reads them into a
LaunchConfig.

Before any rank starts: the run's usage errors (cli/run_inputs.py: data, tokenizer, --disk-tier,
--resume), the node admission (cli/node_admission.py, both called by train_cmd) and the
rendezvous checks (rendezvous.py: the master address resolves, the master port is free on node
0; the rendezvous waits at most --dist-timeout). While the ranks run, each watches this process
and beats (watchdog.py): killed outright, the launcher takes its ranks with it; a rank stopped
mid-run is named as the cause when a peer fails waiting for it, a rank killed by a signal
likewise when a peer exits on noticing it (first_failure). The heartbeat folder is private and
named after the launcher, so a launcher killed before it could remove it has it removed by the
next launch (heartbeat_dir.py). Stopped by a signal (SIGINT, SIGTERM, SIGHUP: torch.distributed.run
forwards it to the ranks, which checkpoint and stop), the launcher exits 128 + the signal, without
torch's SignalException traceback. A signal the launcher was started ignoring (`nohup`'s SIGHUP)
stays ignored by it and by its ranks, which inherit that (elastic_signals).
"""
import os
import signal
import sys
from dataclasses import dataclass

from horizon_sim.errors import HorizonError

ARGS_ENV = "HORIZON_TRAIN_ARGS"


@dataclass(kw_only=True, frozen=True, slots=True)
class LaunchConfig:
    """This node's part of a data-parallel run and how its ranks meet (the flags named in the
    errors, which are the CLI's words: only `horizon train` makes one). Checked when made."""
    nproc_per_node: int = 1
    """Processes (devices) on this node."""
    nnodes: int = 1
    node_rank: int = 0
    """This node's rank, 0 .. nnodes-1."""
    master_addr: str = "127.0.0.1"
    """Node 0's address for the rendezvous."""
    master_port: int = 29500
    dist_timeout: float = 300.0
    """Seconds a collective waits for its peers (and the rendezvous for the nodes)."""
    oversubscribe: bool = False
    """Run more ranks than this node has CPU cores (the node admission refuses it otherwise)."""

    def __post_init__(self):
        for flag, v, lo in (("--nproc-per-node", self.nproc_per_node, 1), ("--nnodes", self.nnodes, 1),
                            ("--node-rank", self.node_rank, 0), ("--master-port", self.master_port, 1)):
            if v < lo:
                raise HorizonError(f"{flag} {v} must be >= {lo}")
        if self.node_rank >= self.nnodes:
            raise HorizonError(f"--node-rank {self.node_rank} must be below --nnodes {self.nnodes}")
        if self.master_port > 65535:
            raise HorizonError(f"--master-port {self.master_port} must be at most 65535")
        if not (0 < self.dist_timeout < float("inf")):
            raise HorizonError(f"--dist-timeout {self.dist_timeout} must be a positive number of seconds")

    @property
    def ranks(self) -> int:
        return self.nproc_per_node * self.nnodes


def wants_launch(ranks: int) -> bool:
    """Several processes (`ranks` in all) were asked for and this is not one of them yet."""
    from horizon_exec.dist.context import launched
    return ranks > 1 and not launched()


ELASTIC_SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
ELASTIC_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
"""The signals torch.distributed.run's launcher handles (stops its ranks and raises
SignalException on) unless ELASTIC_SIGNALS_ENV names others: torch's default."""


def elastic_signals(asked: str | None) -> str:
    """ELASTIC_SIGNALS_ENV for the launcher: the signals asked for (torch's default where None)
    less those this process ignores, which torch would otherwise handle over SIG_IGN and stop a
    `nohup` run on a hang-up. torch registers at least one, so SIGTERM stays where all are
    ignored."""
    names = [n.strip() for n in (asked or ELASTIC_SIGNALS).split(",") if n.strip()]
    kept = [n for n in names if not (hasattr(signal, n) and signal.getsignal(getattr(signal, n)) is signal.SIG_IGN)]
    return ",".join(kept) or "SIGTERM"


def launch(a: LaunchConfig, worker_args: str) -> int:
    """Run this node's workers, each handed `worker_args` (ARGS_ENV, module docstring); their exit
    status (the first failure's, named on stderr)."""
    from horizon_exec.dist.rendezvous import check_rendezvous, quiet_cpp_logs
    check_rendezvous(a.master_addr, a.master_port, a.node_rank, a.dist_timeout)  # exit 2 before any rank
    quiet_cpp_logs()
    from horizon_exec.dist import heartbeat_dir, watchdog
    heartbeat_dir.sweep_stale()  # the folders of launchers killed before they could remove theirs
    beats = heartbeat_dir.make()  # the ranks' heartbeats (watchdog.py)
    os.environ[watchdog.HEARTBEAT_ENV] = beats
    # torch.distributed.run starts each worker as `python -m horizon_exec.cli.train_cmd` in the
    # user's folder, whose own horizon_exec/ (or torch/) would run first: never from there
    # (PYTHONSAFEPATH), and this checkout first on the path so an uninstalled one still imports.
    from horizon_exec.child_env import child_env
    was = {k: os.environ.get(k) for k in ("PYTHONSAFEPATH", "PYTHONPATH", ELASTIC_SIGNALS_ENV)}
    os.environ.update(PYTHONSAFEPATH="1", PYTHONPATH=child_env()["PYTHONPATH"],
                      **{ELASTIC_SIGNALS_ENV: elastic_signals(os.environ.get(ELASTIC_SIGNALS_ENV))})
    try:
        return _run(a, beats, worker_args)
    finally:
        for k, v in was.items():  # a launch made in-process (tests, the Python API) leaves no trace
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        import shutil
        shutil.rmtree(beats, ignore_errors=True)


def _run(a: LaunchConfig, beats: str, worker_args: str) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from horizon_exec.dist.rendezvous import rendezvous_conf
    from horizon_exec.dist.watchdog import last_beats, stalled_ranks
    os.environ[ARGS_ENV] = worker_args
    argv = ["--nproc-per-node", str(a.nproc_per_node), "--nnodes", str(a.nnodes), "--node-rank", str(a.node_rank),
            "--master-addr", a.master_addr, "--master-port", str(a.master_port), "--max-restarts", "0",
            "--rdzv-conf", rendezvous_conf(a.dist_timeout), "--module", "horizon_exec.cli.train_cmd"]
    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        rank, f = first_failure(e.failures)
        code = f.exitcode if f.exitcode and f.exitcode > 0 else 1
        sig = killed_by(f.exitcode)
        if sig is not None and sig != LAUNCHER_STOP:  # the cause itself, whatever its peers did next
            verb = "stopped" if sig in HANDLED and f.exitcode > 0 else "killed"  # (a handler exited 128 + it)
            line = f"rank {rank} was {verb} by {sig.name}" + (f" (exit code {f.exitcode})" if f.exitcode > 0 else "")
        else:
            how = f"signal {-f.exitcode}" if f.exitcode and f.exitcode < 0 else f"exit code {f.exitcode}"
            line = failure_line(rank, how, last_beats(beats), stalled_ranks)
        print(f"horizon train: {line}; every other rank was stopped", file=sys.stderr)
        return code
    except SignalException as e:  # the launcher was asked to stop: its ranks were told and have stopped
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - the rendezvous or the agent failed: one line, not torch's frames
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"horizon train: error: the launch at {a.master_addr}:{a.master_port} (node {a.node_rank} of "
              f"{a.nnodes}) failed within --dist-timeout {a.dist_timeout:g} s: {type(e).__name__}: {msg}",
              file=sys.stderr)
        return 1
    return 0


LAUNCHER_STOP = signal.SIGTERM
"""What torch.distributed.run sends the ranks still running once one has failed (SIGKILL only
after 30 s more): a rank ended by it did not cause the failure."""


HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals a rank stops on by itself (a checkpoint, then exit 128 + the signal)."""


def killed_by(exitcode: int | None) -> signal.Signals | None:
    """The signal that ended a rank: a negative return code (-9), or 128 + N (a shell between, or
    the rank's own handler, which exits 128 + the signal: train/stop_signals.py)."""
    if exitcode is None:
        return None
    n = -exitcode if exitcode < 0 else exitcode - 128 if exitcode > 128 else 0
    try:
        return signal.Signals(n) if n > 0 else None
    except ValueError:
        return None


def first_failure(failures: dict, window_s: float | None = None):
    """(rank, failure) of the failure that caused the others. torch.distributed.run stamps each
    failure with the whole second its poll saw it (an error file's stamp where one was written),
    so a rank killed by a signal and the peer that exited 1 on noticing it, moments later, often
    share a second, and the tie went to the lower rank: the survivor (2 of 4 SIGKILLs, issue 43).
    So a rank killed by a signal (not the launcher's own stop) within window_s (the watchdog's
    STALL_S) of the earliest failure is the cause; else the earliest failure not ended by the
    launcher's stop; else the earliest (a stable order: torch records in the order it saw)."""
    from horizon_exec.dist.watchdog import STALL_S
    window_s = STALL_S if window_s is None else window_s
    by_time = sorted(failures.items(), key=lambda kv: kv[1].timestamp)
    t0 = by_time[0][1].timestamp
    early = [kv for kv in by_time if kv[1].timestamp <= t0 + window_s]
    not_stopped = [kv for kv in early if killed_by(kv[1].exitcode) != LAUNCHER_STOP]
    killed = [kv for kv in not_stopped if killed_by(kv[1].exitcode) is not None]
    return (killed or not_stopped or by_time)[0]


def failure_line(rank: int, how: str, beats: dict, stalled_ranks) -> str:
    """Who failed: a rank that stopped beating well before the first failure (stalled: SIGSTOP,
    starved) is named as the cause, since the first to fail only gave up waiting for it."""
    stalled = stalled_ranks(beats, rank)
    if not stalled:
        return f"rank {rank} failed first ({how})"
    r = stalled[0]
    return (f"rank {r} stalled (no heartbeat for {beats[rank] - beats[r]:.0f} s before rank {rank} gave up "
            f"waiting for it, {how}: stopped, e.g. SIGSTOP, or starved)")
