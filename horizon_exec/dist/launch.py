"""`horizon train --nproc-per-node N [--nnodes M --node-rank J --master-addr A --master-port P]`:
start the run's processes through torch.distributed's own launcher (torch.distributed.run, the
code behind torchrun: env:// rendezvous, a worker that fails takes the others down).

The workers run `horizon_exec.cli.train_cmd` as a module with the parent's parsed arguments
(HORIZON_TRAIN_ARGS, JSON), so they train exactly what the parent checked; plain
`torchrun --nproc-per-node N -m horizon_exec.cli.train_cmd --model tiny ...` works as well.

Before any rank starts: the node admission (cli/node_admission.py, called by train_cmd) and the
rendezvous checks (rendezvous.py: the master address resolves, the master port is free on node
0; the rendezvous waits at most --dist-timeout). While the ranks run, each watches this process
and beats (watchdog.py): killed outright, the launcher takes its ranks with it; a rank stopped
mid-run is named as the cause when a peer fails waiting for it. Stopped by a signal (SIGINT,
SIGTERM, SIGHUP: torch.distributed.run forwards it to the ranks, which checkpoint and stop), the
launcher exits 128 + the signal, without torch's SignalException traceback.
"""
import argparse
import json
import os
import sys

ARGS_ENV = "HORIZON_TRAIN_ARGS"


def add_launch_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data parallel (torch.distributed; gloo on CPU, NCCL between GPUs)")
    g.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="processes (devices) per node; N > 1 or --nnodes > 1 launches the run through "
                        "torch.distributed.run (default 1). --batch is per process: a step trains "
                        "N x nnodes x batch sequences")
    g.add_argument("--oversubscribe", action="store_true",
                   help="run more ranks than this node has CPU cores (refused by default: a rank without a "
                        "core of its own slows every step)")
    g.add_argument("--nnodes", type=int, default=1, metavar="M", help="nodes (default 1)")
    g.add_argument("--node-rank", type=int, default=0, metavar="J", help="this node's rank, 0..M-1 (default 0)")
    g.add_argument("--master-addr", default="127.0.0.1", metavar="HOST",
                   help="node 0's address for the rendezvous (default 127.0.0.1)")
    g.add_argument("--master-port", type=int, default=29500, metavar="PORT", help="its port (default 29500)")
    g.add_argument("--dist-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a collective whose peers do not all join within this fails, naming the rank "
                        "and the op (a dead or stuck rank); every rank then exits non-zero (default 300)")


def check_launch_args(a: argparse.Namespace) -> None:
    from horizon_sim.errors import HorizonError
    for flag, v, lo in (("--nproc-per-node", a.nproc_per_node, 1), ("--nnodes", a.nnodes, 1),
                        ("--node-rank", a.node_rank, 0), ("--master-port", a.master_port, 1)):
        if v < lo:
            raise HorizonError(f"{flag} {v} must be >= {lo}")
    if a.node_rank >= a.nnodes:
        raise HorizonError(f"--node-rank {a.node_rank} must be below --nnodes {a.nnodes}")
    if a.master_port > 65535:
        raise HorizonError(f"--master-port {a.master_port} must be at most 65535")
    if not (0 < a.dist_timeout < float("inf")):
        raise HorizonError(f"--dist-timeout {a.dist_timeout} must be a positive number of seconds")


def wants_launch(a: argparse.Namespace) -> bool:
    """Several processes were asked for and this is not one of them yet."""
    from horizon_exec.dist.context import launched
    return a.nproc_per_node * a.nnodes > 1 and not launched()


def launch(a: argparse.Namespace) -> int:
    """Run the workers; their exit status (the first failure's, named on stderr)."""
    from horizon_exec.dist.rendezvous import check_rendezvous, quiet_cpp_logs
    check_rendezvous(a.master_addr, a.master_port, a.node_rank, a.dist_timeout)  # exit 2 before any rank
    quiet_cpp_logs()
    import tempfile
    from horizon_exec.dist import watchdog
    beats = tempfile.mkdtemp(prefix="horizon-heartbeat-")  # the ranks' heartbeats (watchdog.py)
    os.environ[watchdog.HEARTBEAT_ENV] = beats
    try:
        return _run(a, beats)
    finally:
        import shutil
        shutil.rmtree(beats, ignore_errors=True)


def _run(a: argparse.Namespace, beats: str) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from horizon_exec.dist.rendezvous import rendezvous_conf
    from horizon_exec.dist.watchdog import last_beats, stalled_ranks
    os.environ[ARGS_ENV] = json.dumps({k: v for k, v in vars(a).items()
                                       if isinstance(v, (str, int, float, bool, type(None)))})
    argv = ["--nproc-per-node", str(a.nproc_per_node), "--nnodes", str(a.nnodes), "--node-rank", str(a.node_rank),
            "--master-addr", a.master_addr, "--master-port", str(a.master_port), "--max-restarts", "0",
            "--rdzv-conf", rendezvous_conf(a.dist_timeout), "--module", "horizon_exec.cli.train_cmd"]
    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        rank, f = first_failure(e.failures)
        code = f.exitcode if f.exitcode and f.exitcode > 0 else 1
        how = f"signal {-f.exitcode}" if f.exitcode and f.exitcode < 0 else f"exit code {f.exitcode}"
        print(f"horizon train: {failure_line(rank, how, last_beats(beats), stalled_ranks)}; every other rank "
              "was stopped", file=sys.stderr)
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


def first_failure(failures: dict):
    """(rank, failure) of the earliest failure torch.distributed.run recorded."""
    return min(failures.items(), key=lambda kv: kv[1].timestamp)


def failure_line(rank: int, how: str, beats: dict, stalled_ranks) -> str:
    """Who failed: a rank that stopped beating well before the first failure (stalled: SIGSTOP,
    starved) is named as the cause, since the first to fail only gave up waiting for it."""
    stalled = stalled_ranks(beats, rank)
    if not stalled:
        return f"rank {rank} failed first ({how})"
    r = stalled[0]
    return (f"rank {r} stalled (no heartbeat for {beats[rank] - beats[r]:.0f} s before rank {rank} gave up "
            f"waiting for it, {how}: stopped, e.g. SIGSTOP, or starved)")
