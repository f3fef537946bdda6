"""Layout: how a data-parallel run's ranks are arranged, N devices per node x M nodes.

The one type that spells it: ClusterSpec (the machine), ScheduleMeta (what a Schedule was built
for), Partition (how a unit is split over the ranks) and the executor's DistContext (the run a
process joined) each hold a Layout, so two of them agree when their layouts compare equal.
Rank (i, j) is local rank i of node j; R = N x M (schedule/partition.py numbers the chunks)."""
from dataclasses import dataclass

from horizon_sim.errors import HorizonError

MAX_DEVICES_PER_NODE = 64
MAX_NODES = 4096


def whole_in_range(what: str, v, hi: int) -> int:
    """`v` as an int if it is a whole number from 1 to `hi` (a float like 8.0 from JSON counts)."""
    if isinstance(v, bool) or not isinstance(v, int) and not (isinstance(v, float) and v.is_integer()) \
            or not 1 <= v <= hi:
        raise HorizonError(f"{what}={v!r} must be a whole number from 1 to {hi}")
    return int(v)


@dataclass(frozen=True, slots=True)
class Layout:
    devices_per_node: int = 1
    """N: devices (one rank each) per node."""
    nodes: int = 1
    """M: nodes."""

    def __post_init__(self):
        object.__setattr__(self, "devices_per_node",
                           whole_in_range("devices_per_node", self.devices_per_node, MAX_DEVICES_PER_NODE))
        object.__setattr__(self, "nodes", whole_in_range("nodes", self.nodes, MAX_NODES))

    @property
    def ranks(self) -> int:
        """R = N x M: one rank per device."""
        return self.devices_per_node * self.nodes

    def __str__(self) -> str:
        return f"{self.nodes} node(s) x {self.devices_per_node} device(s)"


ONE = Layout()
"""One device on one node: every single-device plan and run."""
