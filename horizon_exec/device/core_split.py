"""The CPU backend's compute threads for a run: RuntimeConfig.compute_threads resolved.

  N       N threads (the CpuBackend checks it against the cores);
  None    cores - 1, compute and the lanes apart: the split `calibrate` measures its rates at;
  'auto'  the planner's choice for this Schedule (horizon_sim/plan/core_split.py: the fastest
          simulated step over the thread counts it can price), on the --hardware file when it
          is a calibrated CPU file of this many cores, else on CPU_ESTIMATE. Data parallel
          ranks keep cores - 1 of their share (cpu_ranks.py prices that layout).

Torch-free: the CLI parses its flag with threads_arg before anything heavy is imported.
"""
from dataclasses import replace

from horizon_sim.specs.cpu_ranks import is_cpu_backend
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec

AUTO = "auto"

CPU_ESTIMATE = HardwareSpec(
    name="CPU backend estimate (this project's 2-core EPYC calibration, reports/machine.toml, rounded)",
    device=DeviceSpec(name="cpu-core (1 thread)", hbm_GiB=16, bf16_TFLOPs=0.015, fp32_TFLOPs=0.063, hbm_GBps=9,
                      default_link="cpu-threads", matmul_efficiency=0.36, reserved_GiB=0,
                      launch_overhead_us=3000, reduce_GBps=0.8, compute_threads=1),
    link=LinkSpec(name="cpu-threads", h2d_GBps=11, d2h_GBps=9, latency_us=140, pageable_GBps=11,
                  busy_latency_us=180, cpu_driven=True),
    host=HostSpec(name="cpu", ram_GiB=16, dram_GBps=22, cores=2, adam_Gparams_per_s=0.8, os_reserved_GiB=1,
                  runtime_overhead_GiB=0.4, lane_cores=0.87, thread_GBps=2, op_latency_us=60,
                  busy_latency_us=360))
"""What 'auto' prices a split with when no calibrated file of this machine is given: only the
ratio of the lanes' work to compute's matters for the choice, and a core of another x86 host
is within a few times of this one's on both (no measured thread scaling: estimates)."""


def threads_arg(text: str):
    """--compute-threads's value: 'auto', or the number it spells (RuntimeConfig checks it)."""
    t = text.strip()
    return int(t) if t.lstrip("-").isdigit() else t


def pricing_hardware(hardware: HardwareSpec | None, cores: int) -> HardwareSpec:
    """The file 'auto' prices with: `hardware` when it is a CPU-backend file of `cores` cores;
    another machine's CPU file, or none, gives its (or CPU_ESTIMATE's) rates on `cores` cores,
    with estimated thread scaling (its measured rows were for other cores)."""
    hw = hardware if hardware is not None and is_cpu_backend(hardware) else CPU_ESTIMATE
    if hw.host.cores == cores and hw is hardware:
        return hw
    t0 = min(hw.device.compute_threads or max(1, hw.host.cores - 1), max(1, cores - 1))
    return replace(hw, device=replace(hw.device, compute_threads=t0, thread_speed=()),
                   host=replace(hw.host, cores=cores))


def with_disk_for(sched, hw: HardwareSpec) -> HardwareSpec:
    """`hw`, given a disk when the Schedule streams state from one and `hw` has none (a file
    without the disk tier's rates): the run's disk is real, and the split only needs its ops
    priced, not exactly (the planner's default rate, 7 GB/s: an estimate)."""
    from horizon_sim.cli.hardware_args import DISK_GBPS_DEFAULT
    from horizon_sim.schedule.op import Lane
    if hw.host.disk_GiB or not any(op.lane == Lane.DISK for op in sched.ops):
        return hw
    need_GiB = sum(b.bytes for b in sched.buffers.values() if b.space.value == "disk") / 2**30 + 1
    return replace(hw, host=replace(hw.host, disk_GiB=need_GiB, disk_read_GBps=DISK_GBPS_DEFAULT,
                                    disk_write_GBps=DISK_GBPS_DEFAULT))


def resolve_compute_threads(setting, sched, hardware: HardwareSpec | None, cores: int,
                            ranks: int = 1) -> tuple[int | None, str]:
    """(compute threads for the CpuBackend, None: its cores - 1; why, one line)."""
    if setting != AUTO:
        return setting, ("cores - 1 (fixed)" if setting is None else f"{setting} (given)")
    if ranks > 1 or cores < 2:
        return None, "cores - 1 of this rank's share (data parallel)" if ranks > 1 else "one core"
    from horizon_sim.plan.core_split import choose_split
    split = choose_split(sched, with_disk_for(sched, pricing_hardware(hardware, cores)))
    return split.compute_threads, "auto: " + split.line()
