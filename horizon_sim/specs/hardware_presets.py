"""Named device, link and host presets, and make_hardware() that combines them.

Where every number comes from (datasheet, measured, published or estimate) is data in
preset_sources.py (`horizon plan --gpu NAME --sources` prints it; a test checks that every
priced number has an entry). Conventions:
- Device peaks are dense (the datasheets print bf16 "with sparsity", twice the dense figure).
- hbm_GiB is the memory.total the driver reports (nvidia-smi, in MiB, divided by 1024), not
  the marketing GB: an H200 sold as "141 GB" reports 143771 MiB = 140.4 GiB.
- Link bandwidths are ACHIEVED large-copy rates from pinned memory (nvbandwidth's
  host_to_device_memcpy_ce / device_to_host_memcpy_ce, CUDA's bandwidthTest), not the wire rate.
`horizon calibrate` replaces all of them with numbers from the machine at hand.
"""
from dataclasses import replace

from horizon_sim.errors import HorizonError
from horizon_sim.specs.cluster import make_cluster
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
from horizon_sim.specs.layout import ONE, Layout
from horizon_sim.specs.measured_kernels import (fa2_a100_attention, gh100_kernels, h100_pcie_kernels, rtx4090_kernels,
                                                v100_megatron_kernels)
from horizon_sim.units import GiB, closest, fmt_bytes, parse_size

# ---- links ---------------------------------------------------------------------------------
# Theoretical per-direction rate of each link, GB/s, for "x% of peak" and sanity checks.
# PCIe x16 after 128b/130b encoding: gen3 8 GT/s -> 15.75, gen4 16 GT/s -> 31.5,
# gen5 32 GT/s -> 63.0. NVLink-C2C: 900 GB/s total, 450 GB/s per direction (GH200 datasheet).
LINK_PEAK_GBps: dict[str, float] = {
    "pcie-gen3": 15.75,
    "pcie-gen4": 31.5,
    "pcie-gen5": 63.0,
    "nvlink-c2c": 450.0,
}

LINKS: dict[str, LinkSpec] = {
    k.name: k for k in (
        LinkSpec(name="pcie-gen3", h2d_GBps=12.0, d2h_GBps=13.0, latency_us=10.0,
                 pageable_GBps=6.0),
        LinkSpec(name="pcie-gen4", h2d_GBps=25.0, d2h_GBps=26.0, latency_us=10.0,
                 pageable_GBps=10.0),
        LinkSpec(name="pcie-gen5", h2d_GBps=55.0, d2h_GBps=55.0, latency_us=10.0,
                 pageable_GBps=15.0),
        LinkSpec(name="nvlink-c2c", h2d_GBps=337.0, d2h_GBps=295.0, latency_us=5.0,
                 pageable_GBps=100.0),
    )
}


def _mib(n: int) -> float:
    """nvidia-smi memory.total (MiB) in GiB."""
    return n / 1024


# ---- devices -------------------------------------------------------------------------------
# library_workspace_MiB: the cuBLAS + cuBLASLt workspaces PyTorch keeps for the compute stream
# (measured on Hopper, estimated before it: preset_sources.py). The GH100 parts' kernel rates
# (GEMM by shape, attention, elementwise, loss, per-op costs) come from an H200 measurement
# (measured_kernels.py; the H100 PCIe's GEMMs capped where its 350 W limit levels them off, from
# a published microbenchmark), the RTX 4090's GEMMs from that microbenchmark; the others price
# GEMMs at peak x matmul_efficiency.
HOPPER_WORKSPACE_MiB = 64.0
PRE_HOPPER_WORKSPACE_MiB = 16.25
DEVICES: dict[str, DeviceSpec] = {
    d.name: d for d in (
        DeviceSpec(name="a100-40gb", hbm_GiB=_mib(40960), bf16_TFLOPs=312.0, fp32_TFLOPs=19.5,
                   hbm_GBps=1555.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB,
                   attention_TFLOPs=fa2_a100_attention()),
        DeviceSpec(name="a100-80gb", hbm_GiB=_mib(81920), bf16_TFLOPs=312.0, fp32_TFLOPs=19.5,
                   hbm_GBps=2039.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB,
                   attention_TFLOPs=fa2_a100_attention()),
        DeviceSpec(name="h100-sxm", hbm_GiB=_mib(81559), bf16_TFLOPs=989.0, fp32_TFLOPs=67.0,
                   hbm_GBps=3350.0, default_link="pcie-gen5",
                   library_workspace_MiB=HOPPER_WORKSPACE_MiB,
                   **gh100_kernels(989.0, 3350.0)),
        DeviceSpec(name="h100-pcie", hbm_GiB=_mib(81559), bf16_TFLOPs=756.0, fp32_TFLOPs=51.0,
                   hbm_GBps=2000.0, default_link="pcie-gen5",
                   library_workspace_MiB=HOPPER_WORKSPACE_MiB,
                   **h100_pcie_kernels(756.0, 2000.0)),
        DeviceSpec(name="h200", hbm_GiB=_mib(143771), bf16_TFLOPs=989.0, fp32_TFLOPs=67.0,
                   hbm_GBps=4800.0, default_link="pcie-gen5",
                   library_workspace_MiB=HOPPER_WORKSPACE_MiB,
                   **gh100_kernels(989.0, 4800.0)),
        DeviceSpec(name="gh200", hbm_GiB=_mib(97871), bf16_TFLOPs=990.0, fp32_TFLOPs=67.0,
                   hbm_GBps=4000.0, default_link="nvlink-c2c",
                   library_workspace_MiB=HOPPER_WORKSPACE_MiB,
                   **gh100_kernels(990.0, 4000.0)),
        DeviceSpec(name="l40s", hbm_GiB=_mib(46068), bf16_TFLOPs=362.05, fp32_TFLOPs=91.6,
                   hbm_GBps=864.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB),
        DeviceSpec(name="rtx-4090", hbm_GiB=_mib(24564), bf16_TFLOPs=165.2, fp32_TFLOPs=82.6,
                   hbm_GBps=1008.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB, **rtx4090_kernels()),
        DeviceSpec(name="rtx-3090", hbm_GiB=_mib(24576), bf16_TFLOPs=71.0, fp32_TFLOPs=35.6,
                   hbm_GBps=936.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB),
        # Volta has no bf16: its 16-bit rate is fp16, what the published V100 runs trained in;
        # its compute at the rate DeepSpeed's tutorial measured for Megatron-LM v1.1.5 on it.
        DeviceSpec(name="v100-32gb", hbm_GiB=_mib(32480), bf16_TFLOPs=125.0, fp32_TFLOPs=15.7,
                   hbm_GBps=900.0, default_link="pcie-gen3",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB, **v100_megatron_kernels()),
    )
}

# ---- hosts ---------------------------------------------------------------------------------
HOSTS: dict[str, HostSpec] = {
    h.name: h for h in (
        # ram_GiB is a placeholder on every host: make_hardware(ram=...) replaces it.
        # dram_GBps (achieved) is a fraction of the channels' peak, dram_channels x dram_MTps x 8 B.
        # A dual-socket x86 server: 16 channels of DDR4-3200 (409.6 GB/s).
        HostSpec(name="default", ram_GiB=512.0, dram_GBps=300.0, cores=64,
                 adam_Gparams_per_s=4.0, dram_channels=16, dram_MTps=3200.0),
        # NVIDIA Grace, the CPU half of a GH200 "480GB" (480e9 bytes of LPDDR5X = 447 GiB):
        # a 512-bit LPDDR5X-8533 interface, 8 channels' worth of 64 bits (546 GB/s).
        HostSpec(name="grace", ram_GiB=447.0, dram_GBps=410.0, cores=72,
                 adam_Gparams_per_s=10.4, deepspeed_adam_Gparams_per_s=10.4, dram_channels=8, dram_MTps=8533.0),
        # NVIDIA DGX-2 (1.5 TB), the V100 box of DeepSpeed's published ZeRO-Offload runs:
        # 2 x 6 channels of DDR4-2666 (256 GB/s).
        HostSpec(name="dgx-2", ram_GiB=1397.0, dram_GBps=190.0, cores=48,
                 adam_Gparams_per_s=1.6, deepspeed_adam_Gparams_per_s=1.6, dram_channels=12, dram_MTps=2666.0),
        # A desktop or workstation for the RTX cards: 16 cores, 2 channels of DDR5-5600 (89.6 GB/s).
        HostSpec(name="desktop", ram_GiB=128.0, dram_GBps=60.0, cores=16,
                 adam_Gparams_per_s=1.0, os_reserved_GiB=6.0, dram_channels=2, dram_MTps=5600.0),
    )
}


def _lookup(kind: str, table: dict, name):
    if not isinstance(name, str):
        raise HorizonError(f"{kind} name {name!r} must be a string; presets: {', '.join(table)}")
    try:
        return table[name.strip().lower()]
    except KeyError:
        raise HorizonError(
            f"unknown {kind} {name!r}{closest(name.strip(), table)}; presets: {', '.join(table)}"
        ) from None


def device_preset(name: str) -> DeviceSpec:
    return _lookup("gpu", DEVICES, name)


# ---- local disks for the disk tier: (sequential read GB/s, sequential write GB/s) -------------
DISKS: dict[str, tuple[float, float]] = {
    # Micron 9400 PRO (PCIe Gen4 x4, U.3), product brief: 7,000 MB/s sequential read and write.
    "micron-9400": (7.0, 7.0),
    # Samsung PM1743 (PCIe Gen5 x4), product brief: 13,000 MB/s read, 6,600 MB/s write.
    "pm1743": (13.0, 6.6),
    # Samsung 990 PRO 4 TB (consumer PCIe Gen4), datasheet: 7,450 MB/s read, 6,900 MB/s write.
    "990-pro": (7.45, 6.9),
}
"""Datasheet sequential rates (the drives' best case: large blocks, deep queues; calibrate
measures a real one with the executor's own I/O)."""


def link_preset(name: str) -> LinkSpec:
    return _lookup("link", LINKS, name)


def host_preset(name: str) -> HostSpec:
    return _lookup("host", HOSTS, name)


DEFAULT_HOSTS: dict[str, str] = {
    # A GH200 is one module: the Hopper GPU and a Grace CPU joined by NVLink-C2C (NVIDIA GH200
    # datasheet), so its host is Grace whatever box it sits in, never the x86 default.
    "gh200": "grace",
    # DeepSpeed's published V100 offload runs are on a DGX-2; a V100 is planned on its host.
    "v100-32gb": "dgx-2",
    # The consumer cards sit in desktops and workstations (PCIe 4.0, two DDR5 channels, one
    # socket), not in dual-socket servers.
    "rtx-4090": "desktop",
    "rtx-3090": "desktop",
}
"""Device preset -> the host preset it comes with; others get 'default' (an x86 server)."""


def make_hardware(gpu: str, ram: str | int | None = None, link: str | None = None,
                  host: str | None = None, layout: Layout = ONE, cluster: str | None = None) -> HardwareSpec:
    """A machine from presets: `gpu` with its default link unless `link` is given, and the
    `host` preset (default: the one the device comes with, DEFAULT_HOSTS) with its RAM replaced
    by `ram` ('1.5TB', '1024GiB', '512G' or bytes; per node); `layout` (devices per node x
    nodes) joined as the `cluster` preset (default: the box the device usually comes in;
    cluster.py)."""
    dev = device_preset(gpu)
    lnk = link_preset(dev.default_link if link is None else link)
    hst = host_preset(host if host is not None else DEFAULT_HOSTS.get(dev.name, "default"))
    if ram is not None:
        hst = replace(hst, ram_GiB=parse_size(ram, "ram") / GiB)
    cl = make_cluster(gpu, layout, cluster)
    name = f"{dev.name} / {lnk.name} / {hst.name} host, {fmt_bytes(hst.ram_GiB * GiB)} RAM"
    if cl.ranks > 1:
        name = f"{cl.layout.nodes} x {cl.layout.devices_per_node} x " + name + " per node"
    return HardwareSpec(device=dev, link=lnk, host=hst, name=name, cluster=cl)
