"""The machine flags the planner's verbs share: a device, link and RAM preset or a hardware
file, and the data-parallel layout (devices per node, nodes, and the cluster preset that says
what joins them)."""
import argparse
from dataclasses import replace

from horizon_sim.errors import HorizonError
from horizon_sim.specs.cluster import CLUSTERS, make_cluster
from horizon_sim.specs.cpu_ranks import is_cpu_backend, laid_out
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.hardware_presets import DISKS
from horizon_sim.specs.layout import MAX_DEVICES_PER_NODE, MAX_NODES, Layout


DISK_GBPS_DEFAULT = 7.0
"""--disk-GBps when only --disk is given: one PCIe Gen4 data-center NVMe drive (Micron 9400
PRO datasheet: 7.0 GB/s sequential read and write)."""


def add_disk_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--disk", default=None, metavar="SIZE",
                   help="local NVMe space for the disk tier (--disk-tier moments), e.g. 4TB (default: none, "
                        "or the hardware file's)")
    p.add_argument("--disk-GBps", default=None, metavar="READ[/WRITE]|DRIVE[xN]",
                   help=f"its sequential bandwidth in GB/s, read and write, or a drive preset ({', '.join(DISKS)}) "
                        f"with xN for N striped (default {DISK_GBPS_DEFAULT:g}: one PCIe Gen4 NVMe; e.g. 26/12, "
                        "pm1743x2)")


def with_disk(hw: HardwareSpec, a: argparse.Namespace) -> HardwareSpec:
    """`hw` with the disk the flags give (unset: the hardware's)."""
    size, rate = getattr(a, "disk", None), getattr(a, "disk_GBps", None)
    if size is None and rate is None:
        return hw
    from horizon_sim.units import GiB, parse_size
    gib = parse_size(size, "--disk") / GiB if size is not None else hw.host.disk_GiB
    if not gib:
        raise HorizonError("--disk-GBps needs --disk SIZE (how much local disk the tier may fill)")
    if rate is None:
        r, w = hw.host.disk_read_GBps or DISK_GBPS_DEFAULT, hw.host.disk_write_GBps or DISK_GBPS_DEFAULT
    else:
        r, w = disk_rates(rate)
    return replace(hw, host=replace(hw.host, disk_GiB=gib, disk_read_GBps=r, disk_write_GBps=w))


def disk_rates(text: str) -> tuple[float, float]:
    """(read, write) GB/s from '25', '26/12', or a drive preset with an optional 'xN' (striped)."""
    name, _, count = str(text).partition("x")
    if name in DISKS:
        n = int(count) if count.isdigit() and 0 < int(count) <= 64 else (1 if not count else 0)
        if n:
            return DISKS[name][0] * n, DISKS[name][1] * n
    try:
        parts = [float(x) for x in str(text).split("/")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or not all(0 < x < 1e4 for x in parts):
        raise HorizonError(f"--disk-GBps {text!r}: want GB/s as READ or READ/WRITE (25, 26/12), or a drive "
                           f"({', '.join(DISKS)}) with an optional xN for N striped (1..64), e.g. pm1743x2")
    return parts[0], parts[-1]


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="devices per node, each a data-parallel rank running --batch sequences (default 1, "
                        "or the hardware file's)")
    p.add_argument("--nodes", type=int, default=None, metavar="M",
                   help="nodes; host RAM (--ram) is per node (default 1, or the hardware file's)")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help=f"what joins the devices and nodes: {', '.join(CLUSTERS)} (default: the box the GPU "
                        "usually comes in; see horizon_sim/specs/cluster.py)")
    add_disk_args(p)


def _count(flag: str, v: int | None, hi: int) -> None:
    if v is not None and not 1 <= v <= hi:
        raise HorizonError(f"{flag} {v}: use a whole number from 1 to {hi}")


def with_cluster(hw: HardwareSpec, a: argparse.Namespace) -> HardwareSpec:
    """`hw` with the layout (and the disk) the flags ask for (unset flags keep the hardware's)."""
    hw = with_disk(hw, a)
    gpus, nodes, preset = getattr(a, "gpus", None), getattr(a, "nodes", None), getattr(a, "cluster", None)
    _count("--gpus", gpus, MAX_DEVICES_PER_NODE)
    _count("--nodes", nodes, MAX_NODES)
    if gpus is None and nodes is None and preset is None:
        return hw
    c = hw.cluster
    layout = Layout(c.layout.devices_per_node if gpus is None else gpus, c.layout.nodes if nodes is None else nodes)
    if preset is None and (is_cpu_backend(hw) or c.ranks > 1 or c.fabric_GBps > 0 or c.net_GBps > 0):
        # a calibrated CPU machine's cores shared by its processes, or the hardware's own fabric
        # and network (a file's, or what calibrate measured) with new counts (specs/cpu_ranks.py)
        return laid_out(hw, layout)
    return replace(hw, cluster=make_cluster(hw.device.name, layout, preset))
