"""The machine flags the planner's verbs share: a device, link and RAM preset or a hardware
file, and the data-parallel layout (devices per node, nodes, and the cluster preset that says
what joins them)."""
import argparse
from dataclasses import replace

from horizon_sim.errors import HorizonError
from horizon_sim.specs.cluster import CLUSTERS, MAX_DEVICES_PER_NODE, MAX_NODES, make_cluster
from horizon_sim.specs.cpu_ranks import is_cpu_backend, laid_out
from horizon_sim.specs.hardware import HardwareSpec


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="devices per node, each a data-parallel rank running --batch sequences (default 1, "
                        "or the hardware file's)")
    p.add_argument("--nodes", type=int, default=None, metavar="M",
                   help="nodes; host RAM (--ram) is per node (default 1, or the hardware file's)")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help=f"what joins the devices and nodes: {', '.join(CLUSTERS)} (default: the box the GPU "
                        "usually comes in; see horizon_sim/specs/cluster.py)")


def _count(flag: str, v: int | None, hi: int) -> None:
    if v is not None and not 1 <= v <= hi:
        raise HorizonError(f"{flag} {v}: use a whole number from 1 to {hi}")


def with_cluster(hw: HardwareSpec, a: argparse.Namespace) -> HardwareSpec:
    """`hw` with the layout the flags ask for (unset flags keep the hardware's)."""
    gpus, nodes, preset = getattr(a, "gpus", None), getattr(a, "nodes", None), getattr(a, "cluster", None)
    _count("--gpus", gpus, MAX_DEVICES_PER_NODE)
    _count("--nodes", nodes, MAX_NODES)
    if gpus is None and nodes is None and preset is None:
        return hw
    c = hw.cluster
    g = c.devices_per_node if gpus is None else gpus
    n = c.nodes if nodes is None else nodes
    if preset is None and (is_cpu_backend(hw) or c.ranks > 1 or c.fabric_GBps > 0 or c.net_GBps > 0):
        # a calibrated CPU machine's cores shared by its processes, or the hardware's own fabric
        # and network (a file's, or what calibrate measured) with new counts (specs/cpu_ranks.py)
        return laid_out(hw, g, n)
    return replace(hw, cluster=make_cluster(hw.device.name, g, n, preset))
