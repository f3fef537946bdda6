"""ClusterSpec: how many devices a node has, how many nodes there are, and what joins them: the
device-to-device fabric inside a node (NVLink or PCIe peer-to-peer), the network between nodes,
and how many devices share one host link. The default is one device on one node, the machine
every single-device plan assumes. Units are in the field names (GB/s = 1e9 bytes/s, per
direction).

Presets cite their sources; figures marked *estimate* are until measured."""
import math
from dataclasses import dataclass, replace

from horizon_sim.errors import HorizonError
from horizon_sim.specs import ranges
from horizon_sim.specs.layout import MAX_DEVICES_PER_NODE, ONE, Layout, whole_in_range
from horizon_sim.units import closest


@dataclass(kw_only=True, frozen=True, slots=True)
class ClusterSpec:
    name: str = "single"
    layout: Layout = ONE
    """Devices per node x nodes."""
    fabric_GBps: float = 0.0
    """Device-to-device bandwidth inside a node, per device and direction (what a ring
    collective moves per link); 0 is allowed only with one device per node."""
    fabric_latency_us: float = 5.0
    """Fixed cost of one step of a ring collective on the fabric."""
    net_GBps: float = 0.0
    """Network bandwidth between nodes, per node and direction (the sum of its NICs); the node's
    devices share it. 0 is allowed only with one node."""
    net_latency_us: float = 10.0
    """Fixed cost of one step of a ring collective across nodes."""
    devices_per_host_link: int = 1
    """Devices behind one host link (a PCIe switch's uplink): each gets 1/k of the link's rate
    when all copy at once, as they do in a data-parallel step."""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise HorizonError(f"cluster name={self.name!r} must be a non-empty string")
        if not isinstance(self.layout, Layout):
            raise HorizonError(f"cluster layout={self.layout!r} must be a Layout (devices per node x nodes)")
        object.__setattr__(self, "devices_per_host_link", whole_in_range(
            "cluster devices_per_host_link", self.devices_per_host_link, MAX_DEVICES_PER_NODE))
        for f in ("fabric_GBps", "fabric_latency_us", "net_GBps", "net_latency_us"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise HorizonError(f"cluster {f}={v!r} must be a finite number >= 0")
            if why := ranges.out_of_range(v, *ranges.CLUSTER[f]):  # finite but overflowing the planner
                raise HorizonError(f"cluster {f}={v!r} {why}")
            object.__setattr__(self, f, float(v))
        n, m = self.layout.devices_per_node, self.layout.nodes
        if n > 1 and self.fabric_GBps <= 0:
            raise HorizonError(f"cluster {self.name}: {n} devices per node need "
                               "fabric_GBps > 0 (NVLink or PCIe peer-to-peer bandwidth)")
        if m > 1 and self.net_GBps <= 0:
            raise HorizonError(f"cluster {self.name}: {m} nodes need net_GBps > 0")
        if self.devices_per_host_link > n:
            raise HorizonError(f"cluster devices_per_host_link={self.devices_per_host_link} is more than "
                               f"devices_per_node={n}")

    @property
    def ranks(self) -> int:
        """Data-parallel ranks: one per device."""
        return self.layout.ranks


SINGLE = ClusterSpec()

# Per direction. NVLink 4 (H100 SXM): 900 GB/s total per GPU = 450 each way; NVLink 3 (A100
# SXM): 600 = 300 each way (NVIDIA H100 and A100 datasheets). Achieved NCCL bus bandwidth is
# lower: nccl-tests on HGX H100 report ~360-480 GB/s all-reduce "busbw" (counting both ways),
# so the presets take 0.8 of the datasheet rate (*estimate*).
CLUSTERS: dict[str, ClusterSpec] = {
    # 8 x H100/H200 SXM (HGX/DGX H100): NVLink 4 through NVSwitch; 8 x ConnectX-7 400 Gb/s
    # = 400 GB/s per node (DGX H100 user guide); 4 PCIe gen5 switches, each with 2 GPUs on
    # one uplink to a CPU (DGX H100 block diagram).
    "hgx-h100": ClusterSpec(name="hgx-h100", layout=Layout(8), fabric_GBps=360.0, fabric_latency_us=5.0,
                            net_GBps=400.0 * 0.8, net_latency_us=10.0, devices_per_host_link=2),
    # 8 x A100 SXM (HGX/DGX A100): NVLink 3; 8 x ConnectX-6 200 Gb/s = 200 GB/s per node;
    # 4 PCIe gen4 switches with 2 GPUs each (DGX A100 user guide).
    "hgx-a100": ClusterSpec(name="hgx-a100", layout=Layout(8), fabric_GBps=240.0, fabric_latency_us=5.0,
                            net_GBps=200.0 * 0.8, net_latency_us=10.0, devices_per_host_link=2),
    # 4 x L40S on PCIe gen4, no NVLink: peer-to-peer through the PCIe switch/root complex,
    # *estimate* ~20 GB/s each way; 2 x 100 GbE = 25 GB/s per node, *estimate* 0.8 of it.
    "pcie-4x": ClusterSpec(name="pcie-4x", layout=Layout(4), fabric_GBps=20.0, fabric_latency_us=10.0,
                           net_GBps=25.0 * 0.8, net_latency_us=15.0, devices_per_host_link=1),
    # GH200 nodes: one superchip each, its own NVLink-C2C host link; one 400 Gb/s NIC per
    # superchip (NVIDIA GH200 datasheet: ConnectX-7 or BlueField-3).
    "gh200-nodes": ClusterSpec(name="gh200-nodes", net_GBps=50.0 * 0.8, net_latency_us=10.0),
}

DEFAULT_CLUSTER_OF_DEVICE = {"h100-sxm": "hgx-h100", "h200": "hgx-h100", "a100-80gb": "hgx-a100",
                             "a100-40gb": "hgx-a100", "gh200": "gh200-nodes"}
"""The box a device usually comes in; other devices: pcie-4x."""


def cluster_preset(name: str) -> ClusterSpec:
    if name not in CLUSTERS:
        raise HorizonError(f"unknown cluster {name!r}{closest(name, list(CLUSTERS))}; "
                           f"known: {', '.join(CLUSTERS)}")
    return CLUSTERS[name]


def make_cluster(device: str, layout: Layout = ONE, preset: str | None = None) -> ClusterSpec:
    """`layout` of `device`, joined as `preset` (default: the box the device usually comes in),
    or SINGLE for one device."""
    if layout == ONE and preset is None:
        return SINGLE
    base = cluster_preset(preset or DEFAULT_CLUSTER_OF_DEVICE.get(device, "pcie-4x"))
    if layout.devices_per_node > 1 and base.fabric_GBps <= 0:
        raise HorizonError(f"cluster {base.name} has one device per node; use --gpus 1 or another "
                           f"--cluster ({', '.join(n for n, c in CLUSTERS.items() if c.fabric_GBps > 0)})")
    links = min(base.devices_per_host_link, layout.devices_per_node)
    return replace(base, layout=layout, devices_per_host_link=links)
