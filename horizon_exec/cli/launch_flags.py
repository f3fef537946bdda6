"""`horizon train`'s data-parallel flags: declared here, read into the launcher's LaunchConfig
(dist/launch.py), and the parsed arguments handed to the ranks it starts. Only cli/ reads an
argparse Namespace; the launcher gets typed values and one opaque string for its workers."""
import argparse
import json

from horizon_exec.dist.launch import LaunchConfig


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


def asked_ranks(a: argparse.Namespace) -> int:
    """How many ranks the flags ask for in all (unchecked: read before the flags are)."""
    return a.nproc_per_node * a.nnodes


def launch_config(a: argparse.Namespace) -> LaunchConfig:
    """The launch the flags describe; HorizonError naming the flag of a value it refuses."""
    return LaunchConfig(nproc_per_node=a.nproc_per_node, nnodes=a.nnodes, node_rank=a.node_rank,
                        master_addr=a.master_addr, master_port=a.master_port, dist_timeout=a.dist_timeout,
                        oversubscribe=a.oversubscribe)


def worker_args(a: argparse.Namespace) -> str:
    """The parsed arguments, as the launcher's workers read them back (train_cmd's __main__):
    JSON of every plain value, so the ranks train exactly what this process checked (with
    what it resolved: the default compute dtype, the followed --save-hf)."""
    return json.dumps({k: v for k, v in vars(a).items() if isinstance(v, (str, int, float, bool, type(None)))})
