"""A CPU backend's core split: the compute lane's intra-op threads, the host lanes (copies, the
optimizer, host gathers) on the cores left, or, when compute takes every core, time-sharing
compute's cores. split_hardware(hw, t) is a calibrated CPU file re-priced for t compute threads,
the way cpu_ranks.py lays a file out for N ranks:

  - the compute rates x each kernel kind's speed at t threads (DeviceSpec.thread_kernel_speed:
    GEMM rows, attention rows, elementwise and loss figures each by their own), else x ALONE(t)
    (the template block's, for a file without that table); the per-op fixed costs are one
    Python thread dispatching kernels, whatever the count, and stay. (The block's ALONE mixes
    the two: its small kernels' dispatch does not shorten, so it understates what the rates
    gain, the more so the larger the ops: a 512-token block ran 1.18x faster on 2 threads of a
    2-core VM, a 2,048-token one 1.72x, while its GEMM, attention and elementwise kernels timed
    alone ran 1.9x, 2.0x and 2.4x);
  - host.compute_contention = ALONE(t) / SHARED(t) - 1: how much slower compute runs while a
    host-lane thread works (the simulator applies it while CPU-thread work streams). When the
    lanes share compute's cores this is large: an OpenMP team waits at every barrier for its
    thread that shares a core;
  - host.lane_cores = (the file's lane cores per lane core) x (cores - t) when the lanes have
    cores of their own; when they share compute's, cores / (t + 1) of that: one lane thread
    among t busy compute threads gets that share from the OS scheduler.

ALONE and SHARED come from DeviceSpec.thread_speed (calibrate measures them at each thread
count the executor may use). A file without that table (calibrated before it) gets estimates:
ALONE(t) = t / compute_threads (ideal scaling), SHARED = ALONE / 2 when the lanes share
compute's cores (the team runs at its slowest thread's pace, half a core), else ALONE with
the file's own measured contention. The planner's choice of t is horizon_sim/plan/core_split.py.
"""
from dataclasses import dataclass, replace

from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec


@dataclass(frozen=True, slots=True)
class ThreadSpeed:
    """The compute lane's speed at `threads` intra-op threads, relative to the file's rates."""
    threads: int
    alone: float
    shared: float
    measured: bool
    """From the file's thread_speed table (else the module docstring's estimate)."""


def base_threads(hw: HardwareSpec) -> int:
    """The compute threads the file's rates were measured with (old files: all cores but one,
    calibrate's split then as now)."""
    return hw.device.compute_threads or max(1, hw.host.cores - 1)


def thread_speeds(hw: HardwareSpec) -> dict[int, ThreadSpeed]:
    """Each thread count the file can price: the measured rows, else estimates for 1..cores."""
    if hw.device.thread_speed:
        return {int(t): ThreadSpeed(int(t), a, s, True) for t, a, s in hw.device.thread_speed}
    t0, cores = base_threads(hw), hw.host.cores
    out = {}
    for t in range(1, cores + 1):
        alone = t / t0
        out[t] = ThreadSpeed(t, alone, alone / 2 if t >= cores else alone / (1 + hw.host.compute_contention), False)
    return out


def kernel_factors(hw: HardwareSpec, threads: int, alone_k: float) -> tuple[float, float, float]:
    """(GEMM, attention, elementwise) rate factors of `threads` against the file's own split:
    thread_kernel_speed's rows, else alone_k for all three."""
    rows = {int(r[0]): r[1:] for r in hw.device.thread_kernel_speed}
    t0 = base_threads(hw)
    if threads not in rows or t0 not in rows:
        return alone_k, alone_k, alone_k
    return tuple(a / b for a, b in zip(rows[threads], rows[t0]))


def _scaled_device(d: DeviceSpec, k: tuple[float, float, float], threads: int) -> DeviceSpec:
    """`d` with its GEMM rates x k[0], attention rates x k[1], elementwise and loss rates x k[2]."""
    kg, ka, ke = k

    def rows(table, rate_cols, f):
        return tuple(tuple(v * f if i in rate_cols else v for i, v in enumerate(r)) for r in table)
    return replace(d, name=f"cpu-core ({threads} thread{'s' if threads > 1 else ''})",
                   bf16_TFLOPs=d.bf16_TFLOPs * kg, fp32_TFLOPs=d.fp32_TFLOPs * kg, hbm_GBps=d.hbm_GBps * ke,
                   elementwise_GBps=d.elementwise_GBps * ke, loss_ns_per_logit=d.loss_ns_per_logit / ke,
                   fused_loss_ns_per_logit=d.fused_loss_ns_per_logit / ke,
                   gemm_TFLOPs=rows(d.gemm_TFLOPs, {5}, kg), attention_TFLOPs=rows(d.attention_TFLOPs, {3, 4}, ka),
                   masked_attention_TFLOPs=rows(d.masked_attention_TFLOPs, {3, 4}, ka), compute_threads=threads,
                   thread_speed=(), thread_kernel_speed=())


def split_hardware(hw: HardwareSpec, threads: int) -> HardwareSpec:
    """`hw` (a calibrated CPU-backend file) priced for `threads` compute threads (module docstring)."""
    speeds = thread_speeds(hw)
    if threads not in speeds:
        raise HorizonError(f"compute threads {threads}: the hardware file prices "
                           f"{', '.join(map(str, sorted(speeds)))} (calibrate measures each count it may use)")
    t0, cores, s = base_threads(hw), hw.host.cores, speeds[threads]
    base = speeds.get(t0)
    k = s.alone / base.alone if base else s.alone  # relative to t0's own row: its noise cancels
    per_lane_core = hw.host.lane_cores / max(1, cores - t0) if hw.host.lane_cores else 0.0
    own = cores - threads
    lane_cores = per_lane_core * (own if own > 0 else cores / (threads + 1))
    host = replace(hw.host, compute_contention=max(0.0, s.alone / s.shared - 1.0), lane_cores=lane_cores)
    return replace(hw, device=_scaled_device(hw.device, kernel_factors(hw, threads, k), threads), host=host,
                   name=f"{hw.name}, compute on {threads} of {cores} core(s)")
