"""A calibrated CPU-backend HardwareSpec laid out for N data-parallel ranks on the same machine.

Calibrate measures one rank: compute on its core(s), the lanes on the rest. horizon_exec/dist
gives N ranks an equal share of the cores each, for their compute AND their lanes. What changes
(the cost model then takes 1/N of what the node shares: DRAM bus, lane cores, optimizer rate):
  - host.lane_cores = N/2: a rank's lanes get half of its core while its compute runs (two busy
    threads on one core), 1/2 per rank;
  - host.compute_contention = 1: the compute lane runs at half speed while host work runs on
    its core (processor sharing);
  - host.adam_Gparams_per_s x N: calibrate timed AdamW on the lane core(s) and every rank runs
    its own optimizer on its own core (the core share above slows it), so the node-wide 1/N
    split does not apply;
  - the cluster: N devices on one node, the fabric at the file's measured gloo rate (calibrate
    measures it over loopback), one device per host link (its "link" is its own memory copies).
benchmarks/scaling.py checks the result against measured 1- and 2-rank runs.
"""
from dataclasses import replace

from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.layout import Layout

LOOPBACK_GBps = 1.0
"""A collective rate for a file without a measured one (it only orders simulated events)."""


def is_cpu_backend(hw: HardwareSpec) -> bool:
    """A hardware file of the executor's CPU backend (its link is CPU threads copying)."""
    return bool(hw.link.cpu_driven) and hw.device.name.startswith("cpu")


def laid_out(hw: HardwareSpec, layout: Layout) -> HardwareSpec:
    """`hw` for a job laid out as `layout` (ranks per node x nodes), the one rule the
    planner's --gpus/--nodes on a hardware file, admission and validation share: a calibrated
    CPU machine (one rank, one node) is laid out for its processes sharing its cores
    (cpu_ranks); otherwise the file's own fabric and network with the new counts, at
    LOOPBACK_GBps where the file has no rate."""
    n, m, c = layout.devices_per_node, layout.nodes, hw.cluster
    if c.layout == layout:
        return hw
    if m == 1 and c.ranks == 1 and n > 1 and is_cpu_backend(hw):
        return cpu_ranks(hw, n)
    return replace(hw, cluster=replace(c, layout=layout,
                                       fabric_GBps=c.fabric_GBps or (LOOPBACK_GBps if n > 1 else 0.0),
                                       net_GBps=c.net_GBps or (LOOPBACK_GBps if m > 1 else 0.0),
                                       devices_per_host_link=min(c.devices_per_host_link, n)))


def cpu_ranks(hw: HardwareSpec, n: int) -> HardwareSpec:
    """`hw`, calibrated for one rank, laid out for n ranks on its cores (module docstring)."""
    if n == 1:
        return hw
    c = hw.cluster
    cluster = replace(c, name=f"cpu-{n}-ranks", layout=Layout(n),
                      fabric_GBps=c.fabric_GBps or LOOPBACK_GBps, devices_per_host_link=1)
    host = replace(hw.host, lane_cores=n / 2, compute_contention=1.0,
                   adam_Gparams_per_s=hw.host.adam_Gparams_per_s * n)
    return replace(hw, name=f"{hw.name}, {n} ranks", cluster=cluster, host=host)
