"""Named device, link and host presets, and make_hardware() that combines them.

Sources, so every figure below can be checked:
- Device peaks are NVIDIA datasheet / whitepaper figures, dense (the datasheets print bf16
  "with sparsity", which is twice the dense figure; we store the dense one).
- hbm_GiB is the memory.total the driver reports (nvidia-smi, in MiB, divided by 1024), not
  the marketing GB: an H200 sold as "141 GB" reports 143771 MiB = 140.4 GiB.
- Link bandwidths are ACHIEVED large-copy rates from pinned memory as NVIDIA's nvbandwidth
  (host_to_device_memcpy_ce / device_to_host_memcpy_ce) or CUDA's bandwidthTest report them,
  not the wire rate. Figures marked "estimate" were not found measured; `horizon calibrate`
  replaces all of them with numbers from the machine at hand.
"""
from dataclasses import replace

from horizon_sim.errors import HorizonError
from horizon_sim.specs.cluster import make_cluster
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
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
        # PCIe 3.0 x16. Estimate: pinned copies reach ~12-13 GB/s of 15.75. For reference, an
        # nvbandwidth run on a PCIe 4.0 x8 laptop link (same 15.75 GB/s raw rate) reported
        # 12.98 h2d / 13.17 d2h GB/s. Pageable: estimate, about half of pinned.
        LinkSpec(name="pcie-gen3", h2d_GBps=12.0, d2h_GBps=13.0, latency_us=10.0,
                 pageable_GBps=6.0),
        # PCIe 4.0 x16. nvbandwidth host_to_device_memcpy_ce on an A10 (gen4 x16): 25.17 GB/s.
        # d2h: estimate, typically equal or slightly higher than h2d. Pageable: estimate.
        LinkSpec(name="pcie-gen4", h2d_GBps=25.0, d2h_GBps=26.0, latency_us=10.0,
                 pageable_GBps=10.0),
        # PCIe 5.0 x16. nvbandwidth on HGX H800/H100-class nodes: 55.3-56.5 GB/s h2d and
        # 55.1-57.4 GB/s d2h per GPU. Pageable: estimate (CPU bounce-buffer copy bound).
        LinkSpec(name="pcie-gen5", h2d_GBps=55.0, d2h_GBps=55.0, latency_us=10.0,
                 pageable_GBps=15.0),
        # NVLink-C2C on GH200 (450 GB/s per direction). nvbandwidth v0.6 output for a
        # "GH200 480GB" (driver 550.54) quoted in SuperBench's nvbandwidth test: 337.55 GB/s
        # h2d, 295.23 GB/s d2h. Other reports put h2d nearer 400 GB/s; treat as uncertain.
        # Latency and pageable rate: estimates (pageable memory is reachable over ATS on
        # Grace, so pageable copies are far less penalised than over PCIe).
        LinkSpec(name="nvlink-c2c", h2d_GBps=337.0, d2h_GBps=295.0, latency_us=5.0,
                 pageable_GBps=100.0),
    )
}


def _mib(n: int) -> float:
    """nvidia-smi memory.total (MiB) in GiB."""
    return n / 1024


# ---- devices -------------------------------------------------------------------------------
# library_workspace_MiB (DeviceSpec): the cuBLAS + cuBLASLt workspaces PyTorch keeps for the
# compute stream. Hopper: 64 MiB measured (an H200, torch 2.11+cu130, 2026-11-27: this project's
# device run, tests/test_exec_cuda.py's depth test: 66.3 MiB allocated at rest after a step
# against 2.3 MiB of the executor's own buffers). Earlier GPUs: estimate, 2 x PyTorch's default
# CUBLAS_WORKSPACE_CONFIG below Hopper (":4096:2:16:8" = 8.125 MiB), on the same two-workspace
# pattern.
HOPPER_WORKSPACE_MiB = 64.0
PRE_HOPPER_WORKSPACE_MiB = 16.25
DEVICES: dict[str, DeviceSpec] = {
    d.name: d for d in (
        # A100 SXM4 40GB: NVIDIA A100 datasheet: bf16 312 TF dense (624 sparse), FP32 19.5 TF,
        # HBM2 1,555 GB/s. nvidia-smi "NVIDIA A100-SXM4-40GB": 40960 MiB. Host link PCIe 4.0.
        DeviceSpec(name="a100-40gb", hbm_GiB=_mib(40960), bf16_TFLOPs=312.0, fp32_TFLOPs=19.5,
                   hbm_GBps=1555.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB),
        # A100 SXM4 80GB: same datasheet: bf16 312 TF, FP32 19.5 TF, HBM2e 2,039 GB/s.
        # nvidia-smi "NVIDIA A100-SXM4-80GB": 81920 MiB.
        DeviceSpec(name="a100-80gb", hbm_GiB=_mib(81920), bf16_TFLOPs=312.0, fp32_TFLOPs=19.5,
                   hbm_GBps=2039.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB),
        # H100 SXM5: NVIDIA H100 datasheet: bf16 1,979 TF with sparsity -> 989 dense (989.4),
        # FP32 67 TF, HBM3 3.35 TB/s. nvidia-smi "NVIDIA H100 80GB HBM3": 81559 MiB. PCIe 5.0.
        DeviceSpec(name="h100-sxm", hbm_GiB=_mib(81559), bf16_TFLOPs=989.0, fp32_TFLOPs=67.0,
                   hbm_GBps=3350.0, default_link="pcie-gen5",
                   library_workspace_MiB=HOPPER_WORKSPACE_MiB),
        # H100 PCIe: same datasheet: bf16 1,513 TF sparse -> 756 dense, FP32 51 TF, HBM2e
        # 2.0 TB/s. nvidia-smi "NVIDIA H100 PCIe": 81559 MiB.
        DeviceSpec(name="h100-pcie", hbm_GiB=_mib(81559), bf16_TFLOPs=756.0, fp32_TFLOPs=51.0,
                   hbm_GBps=2000.0, default_link="pcie-gen5",
                   library_workspace_MiB=HOPPER_WORKSPACE_MiB),
        # H200 SXM: NVIDIA H200 datasheet: 141 GB HBM3e at 4.8 TB/s; same GH100 compute as
        # H100 SXM (bf16 989 dense, FP32 67). nvidia-smi "NVIDIA H200": 143771 MiB = 140.4 GiB.
        DeviceSpec(name="h200", hbm_GiB=_mib(143771), bf16_TFLOPs=989.0, fp32_TFLOPs=67.0,
                   hbm_GBps=4800.0, default_link="pcie-gen5",
                   library_workspace_MiB=HOPPER_WORKSPACE_MiB),
        # GH200 (96 GB HBM3 version, sold as "GH200 480GB"): GH200 datasheet: Hopper GPU with
        # bf16 990 TF dense, FP32 67 TF, HBM3 4 TB/s. nvidia-smi "NVIDIA GH200 480GB":
        # 97871 MiB. Host link NVLink-C2C. (The 144 GB HBM3e version reports 146831 MiB.)
        DeviceSpec(name="gh200", hbm_GiB=_mib(97871), bf16_TFLOPs=990.0, fp32_TFLOPs=67.0,
                   hbm_GBps=4000.0, default_link="nvlink-c2c",
                   library_workspace_MiB=HOPPER_WORKSPACE_MiB),
        # L40S: NVIDIA L40S datasheet: bf16 362.05 TF dense (733 sparse), FP32 91.6 TF,
        # GDDR6 864 GB/s, PCIe 4.0 x16. nvidia-smi "NVIDIA L40S": 46068 MiB.
        DeviceSpec(name="l40s", hbm_GiB=_mib(46068), bf16_TFLOPs=362.05, fp32_TFLOPs=91.6,
                   hbm_GBps=864.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB),
        # RTX 4090: NVIDIA Ada (AD102) architecture whitepaper: bf16 tensor with FP32 accumulate
        # 165.2 TF dense (the 330 TF figure is FP16 accumulate), FP32 82.6 TF, GDDR6X
        # 1,008 GB/s. nvidia-smi "NVIDIA GeForce RTX 4090": 24564 MiB. PCIe 4.0 x16.
        DeviceSpec(name="rtx-4090", hbm_GiB=_mib(24564), bf16_TFLOPs=165.2, fp32_TFLOPs=82.6,
                   hbm_GBps=1008.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB),
        # RTX 3090: NVIDIA Ampere GA102 whitepaper (appendix A): bf16 tensor with FP32
        # accumulate 71 TF dense (142 sparse), FP32 35.6 TF, GDDR6X 936 GB/s.
        # nvidia-smi "NVIDIA GeForce RTX 3090": 24576 MiB. PCIe 4.0 x16.
        DeviceSpec(name="rtx-3090", hbm_GiB=_mib(24576), bf16_TFLOPs=71.0, fp32_TFLOPs=35.6,
                   hbm_GBps=936.0, default_link="pcie-gen4",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB),
        # V100 SXM2 32GB (for the published ZeRO-Offload/ZeRO-3 Offload figures, run on DGX-2):
        # NVIDIA V100 datasheet: "Tensor Performance" 125 TF (SXM2), FP32 15.7 TF, HBM2 900 GB/s.
        # Volta has no bf16: its 16-bit rate here is fp16 on tensor cores, the precision those
        # runs trained in (the planner's 16-bit compute dtype stands for either). nvidia-smi
        # memory.total 32480 MiB: DeepSpeed's ZeRO-Offload tutorial screenshot of its DGX-2 run
        # (microsoft/DeepSpeed docs/assets/images/zero_offload_dp1_10B_smi.png, "32290MiB /
        # 32480MiB"). Host link PCIe 3.0 (DGX-2: PCIe switches to the CPUs).
        DeviceSpec(name="v100-32gb", hbm_GiB=_mib(32480), bf16_TFLOPs=125.0, fp32_TFLOPs=15.7,
                   hbm_GBps=900.0, default_link="pcie-gen3",
                   library_workspace_MiB=PRE_HOPPER_WORKSPACE_MiB),
    )
}

# ---- hosts ---------------------------------------------------------------------------------
HOSTS: dict[str, HostSpec] = {
    h.name: h for h in (
        # A generic dual-socket x86 server (e.g. 2x 32-core, 8 DDR4-3200 or DDR5 channels per
        # socket). RAM is a placeholder: make_hardware(ram=...) replaces it with the real size.
        # dram_GBps: estimate, ~75% of the 409.6 GB/s theoretical of 16 DDR4-3200 channels,
        # the usual STREAM-triad fraction. adam_Gparams_per_s: estimate; ZeRO-Offload (Ren et
        # al., 2021) reports its vectorised CPU-Adam at a few 1e9 params/s on a DGX-2 host
        # (2x 24-core Xeon), and a newer 64-core host should do at least as well.
        HostSpec(name="default", ram_GiB=512.0, dram_GBps=300.0, cores=64,
                 adam_Gparams_per_s=4.0),
        # NVIDIA Grace (the CPU half of a GH200 "480GB"): 72 Neoverse V2 cores, 480 GB
        # LPDDR5X at up to 546 GB/s peak (NVIDIA Grace Hopper architecture whitepaper).
        # ram_GiB: 480e9 bytes = 447 GiB (estimate of what the OS reports). dram_GBps:
        # estimate (~75% of peak). adam_Gparams_per_s: DeepSpeed's vectorised CPU Adam on a
        # GH200's Grace, 0.769 for 8B parameters (and 0.098 for 1B): 10.4 G params/s (SuperOffload
        # blog, deepspeedai/DeepSpeed blogs/deepspeed-superoffload, figure 5 "Using GraceAdam ...";
        # the table's unit is not printed, read as seconds per step). Horizon's native AdamW is
        # the same kind of fused, vectorised loop (1.05-1.22x DeepSpeedCPUAdam on x86 here:
        # benchmarks/adam_rates.py).
        HostSpec(name="grace", ram_GiB=447.0, dram_GBps=410.0, cores=72,
                 adam_Gparams_per_s=10.4),
        # NVIDIA DGX-2 (the V100 box of DeepSpeed's published ZeRO-Offload runs): DGX-2
        # datasheet: 2x Intel Xeon Platinum 8168 (24 cores each, 2.7 GHz), 1.5 TB system memory.
        # dram_GBps: estimate, ~75% of 12 channels of DDR4-2666 (256 GB/s theoretical).
        # adam_Gparams_per_s: estimate, the rate of DeepSpeed's vectorised CPU Adam on this host
        # (its ZeRO-Offload tutorial log: a 10B model's optimizer step in 6.2-6.5 s, so ~1.6).
        HostSpec(name="dgx-2", ram_GiB=1397.0, dram_GBps=190.0, cores=48,
                 adam_Gparams_per_s=1.6),
        # A desktop/workstation box for the RTX cards: 16 cores, 2 channels of DDR5-5600
        # (89.6 GB/s theoretical). All three rates: estimates (~70% of theoretical DRAM
        # bandwidth; Adam scaled down by cores from the server estimate).
        HostSpec(name="desktop", ram_GiB=128.0, dram_GBps=60.0, cores=16,
                 adam_Gparams_per_s=1.0, os_reserved_GiB=6.0),
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
}
"""Device preset -> the host preset it comes with; others get 'default' (an x86 server)."""


def make_hardware(gpu: str, ram: str | int | None = None, link: str | None = None,
                  host: str | None = None, gpus: int = 1, nodes: int = 1, cluster: str | None = None) -> HardwareSpec:
    """A machine from presets: `gpu` with its default link unless `link` is given, and the
    `host` preset (default: the one the device comes with, DEFAULT_HOSTS) with its RAM replaced
    by `ram` ('1.5TB', '1024GiB', '512G' or bytes; per node); `gpus` devices per node and
    `nodes` nodes joined as the `cluster` preset (default: the box the device usually comes in;
    cluster.py)."""
    dev = device_preset(gpu)
    lnk = link_preset(dev.default_link if link is None else link)
    hst = host_preset(host if host is not None else DEFAULT_HOSTS.get(dev.name, "default"))
    if ram is not None:
        hst = replace(hst, ram_GiB=parse_size(ram, "ram") / GiB)
    cl = make_cluster(gpu, gpus, nodes, cluster)
    name = f"{dev.name} / {lnk.name} / {hst.name} host, {fmt_bytes(hst.ram_GiB * GiB)} RAM"
    if cl.ranks > 1:
        name = f"{cl.nodes} x {cl.devices_per_node} x " + name + " per node"
    return HardwareSpec(device=dev, link=lnk, host=hst, name=name, cluster=cl)
