"""This machine's quick estimate, for when no calibration of it is cached.

CPU backend (cpu_estimate): a trimmed `horizon calibrate` (docs/calibration.md), each figure
measured as calibrate measures it, in a lane thread set up like the executor's, at the base
split (all cores but one for compute), once:
  GEMMs        bf16 on a (128, 512, 2048) grid plus 8192 token rows (a CPU without native
               bf16 gets the (128, 512) grid), fp32 on calibrate's (128, 512), 3 layouts
  attention    the causal SDPA kernels at ATTENTION_POINTS, masked at MASKED_POINTS, in the dtype
               a default run computes in here: bf16, or fp32 without bf16 instructions (where
               bf16's would take 17 of the estimate's 35 s on an AVX2 EPYC, for runs that
               do not compute in it)
  elementwise  the template block's elementwise bandwidth and the loss kernels per logit
  host         one copy thread each way, a host thread's accumulate and reduce, AdamW, the bus
  per-op cost  the tiny serialized model (calibrate's TinyProbe), two steps, dense rows only
               (no MoE, tracked or head-chunk rows: absent, they cost nothing extra)
  threads      the template block at each compute thread count, alone (the SHARED column is
               core_split.py's estimate: half when the lanes share compute's cores), and each
               kernel kind's scaling, in a default run's dtype
  runtime RSS  this process's RSS at the end (torch, a trainer built and run, the measurement's
               buffers freed): what a training process holds before its model tensors
Left at "not measured": contention between lanes (0), the busy latencies (0), the lanes' shared
cores (one per lane core), the disk tier's disk and the gloo ring.
It takes about 4 s of measuring on a quiet 2-core AMX VM (6 s with torch's import: it runs in a
child process, so the training process's RSS, threads and allocator are not the estimate's).
There `horizon train --model tiny`'s step came out 4.63 s on it against 4.32 s on a full
calibration taken minutes before (one compute thread), and the run measured 3.33 s where it
predicted 3.14 s (docs/calibration.md, "This machine's description").

CUDA (gpu_estimate): the detected GPU's preset (hardware_presets.py, matched by name as
`calibrate --device cuda` matches it) with the GPU's memory, and this host's RAM and cores.
"""
import os
import statistics
import sys
import time
from dataclasses import replace

from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec

BF16_DIMS = (128, 512, 2048)
"""The bf16 grid's N and K (and M, with TOKEN_ROWS): a layer's widths, from small to large."""
TOKEN_ROWS = 8192
"""A micro-batch's tokens (batch x seq: 4 x 2048 by default): the M of a layer's GEMMs, beyond
the grid's (the table does not extrapolate: without it such GEMMs took the 2048-row rate)."""
ATTENTION_POINTS = ((256, 64), (1024, 32), (1024, 64), (1024, 128))
"""(seq, head_dim) of the causal SDPA timed: its rate grows with the sequence (twice from 256 to
1024 here) and with the head dim (1.1-1.4x from 32 to 64), and the table does not extrapolate,
so a long sequence needs a long point and a small head a small one."""
MASKED_POINTS = ((1024, 64),)
ESTIMATE_PRESET = "h100-pcie"
"""The preset a GPU without one of its own is estimated with (its memory replaced by the GPU's)."""


def cpu_estimate() -> HardwareSpec:
    """The CPU backend's quick estimate, measured in this process (module docstring)."""
    import torch

    from horizon_exec.device.cpu import CpuBackend, cpu_cores
    from horizon_exec.measure.calibrate import host as H
    from horizon_exec.measure.calibrate import kernels as K
    from horizon_exec.measure.calibrate.cpu import _bf16_fallback, _elem_points
    from horizon_exec.measure.calibrate.overheads import TinyProbe, op_overheads
    from horizon_exec.measure.calibrate.timing import in_lane
    from horizon_exec.measure.machine.detect import host_ram_GiB
    from horizon_exec.procfs import cpu_name
    from horizon_sim.schedule import Lane, OpKind, work
    from horizon_sim.sim.costs import COPY_TRAFFIC

    backend = CpuBackend()  # cores - 1 for compute: the base split the rates are for
    compute = lambda fn: in_lane(backend, Lane.COMPUTE, fn)  # noqa: E731
    host = lambda fn: in_lane(backend, Lane.CPU, fn)         # noqa: E731
    slow_bf16 = compute(_bf16_fallback)
    from horizon_exec.device.compute_dtype import default_compute_dtype
    from horizon_exec.dtypes import TORCH_DTYPE
    run_dtype = default_compute_dtype("cpu")[0]  # as calibrate: a default run's attention and thread scaling
    dims = BF16_DIMS[:2] if slow_bf16 else BF16_DIMS
    rows = dims if slow_bf16 else (*dims, TOKEN_ROWS)
    bf16_shapes = [(l, m, n, k) for l in work.LAYOUTS for m in rows for n in dims for k in dims
                   if m * n * k <= K.GEMM_MAX_MNK]
    fp32_shapes = [(l, *s) for l in work.LAYOUTS for s in K.gemm_grid(True, "cpu")]
    bf16 = K.gemm_rates([compute(lambda: K.gemm_times(bf16_shapes, torch.bfloat16, "cpu"))])
    fp32 = K.gemm_rates([compute(lambda: K.gemm_times(fp32_shapes, torch.float32, "cpu"))])
    attn, mattn = [], []
    for out, masked, points in ((attn, False, ATTENTION_POINTS), (mattn, True, MASKED_POINTS)):
        for seq, hd in points:
            f, b = compute(lambda: K.measure_attention(seq, hd, TORCH_DTYPE[run_dtype], "cpu", masked=masked))
            out.append((run_dtype, float(seq), float(hd), f, b))
    elem = K.slope_GBps(_elem_points([compute(lambda: K.measure_elementwise(torch.bfloat16, "cpu", True))]))
    loss, fused_loss = K.measure_cpu_loss_figures(2048, compute)
    layer = 2**20
    h2d = host(lambda: H.measure_copy_GBps(layer, "h2d"))
    d2h = host(lambda: H.measure_copy_GBps(layer, "d2h"))
    thread = host(lambda: H.measure_accumulate_GBps(layer // 2))
    reduce = host(lambda: H.measure_reduce_GBps(layer // 2))
    adam = host(lambda: H.measure_adam_Gparams(2**19, True))
    dequant = host(lambda: K.measure_dequant_ns(2**20))  # a quantized base's loads run on a host lane
    bus = H.measure_bus_GBps(8 * 2**20, sorted(set(backend.compute_cores) | set(backend.host_cores)))
    cores = cpu_cores()  # the process's, read here: inside a lane's thread it would be that lane's core(s)
    speeds = _thread_speeds(cores, backend.compute_threads, TORCH_DTYPE[run_dtype])
    from horizon_exec.measure.calibrate.kernel_threads import measure_kernel_speeds
    from horizon_exec.measure.calibrate.threads import thread_counts
    kernel_speeds = compute(lambda: measure_kernel_speeds(cores, backend.compute_threads, True,
                                                          thread_counts(len(cores)), TORCH_DTYPE[run_dtype]))

    ram = host_ram_GiB()
    bf16_best, fp32_best = max(bf16.values()), max(fp32.values())
    gemm = [("bf16", s[0], *map(float, s[1:]), r) for s, r in bf16.items()]
    gemm += [("fp32", s[0], *map(float, s[1:]), r) for s, r in fp32.items()]
    dev = DeviceSpec(name=f"cpu-core ({backend.compute_threads} thread{'s' if backend.compute_threads > 1 else ''})",
                     hbm_GiB=ram, bf16_TFLOPs=bf16_best, fp32_TFLOPs=fp32_best, hbm_GBps=elem,
                     default_link="cpu-threads", matmul_efficiency=statistics.median(bf16.values()) / bf16_best,
                     reserved_GiB=0.0, launch_overhead_us=0.0, reduce_GBps=reduce, loss_ns_per_logit=loss,
                     fused_loss_ns_per_logit=fused_loss, dequant_ns_per_param=dequant,
                     gemm_TFLOPs=tuple(gemm), attention_TFLOPs=tuple(attn), masked_attention_TFLOPs=tuple(mattn),
                     compute_threads=backend.compute_threads, thread_speed=speeds, thread_kernel_speed=kernel_speeds)
    link = LinkSpec(name="cpu-threads", h2d_GBps=h2d, d2h_GBps=d2h, latency_us=0.0, pageable_GBps=h2d,
                    cpu_driven=True)
    hst = HostSpec(name=cpu_name(), ram_GiB=ram, cores=os.cpu_count() or 1, adam_Gparams_per_s=adam,
                   dram_GBps=H.bus_capacity_GBps(bus, adam, COPY_TRAFFIC * h2d, COPY_TRAFFIC * d2h),
                   os_reserved_GiB=H.os_reserved_GiB(ram),
                   lane_cores=float(len(backend.host_cores)), thread_GBps=thread)
    hw = HardwareSpec(device=dev, link=link, host=hst)
    probe = TinyProbe("cpu")  # the per-op fixed costs: its ops' own times less their modelled work
    try:
        probe.sample(2)
    finally:
        probe.close()
    comp_us, copy_us, host_us = op_overheads(hw, probe.own)
    comp_us = {k: v for k, v in comp_us.items() if v > 0}
    from horizon_exec.procfs import rss_bytes
    from horizon_sim.units import GiB
    hst = replace(hst, op_latency_us=host_us, runtime_overhead_GiB=rss_bytes() / GiB)
    return HardwareSpec(
        device=replace(dev, op_overhead_us=tuple(sorted(comp_us.items())),
                       launch_overhead_us=comp_us.get(OpKind.FORWARD.value, 0.0)),
        link=replace(link, latency_us=copy_us), host=hst,
        name=f"{hst.name}, CPU backend: compute on {backend.compute_threads} core(s), lanes on "
             f"{len(backend.host_cores)} (quick estimate {time.strftime('%Y-%m-%d %H:%M')})")


def _thread_speeds(cores: list[int], base: int, dtype) -> tuple:
    """Rows (THREADS, ALONE, SHARED): the template block (calibrate's threads.py workload, one
    round of passes interleaved twice) in `dtype` at each count, relative to `base` threads;
    SHARED is core_split.py's estimate (ALONE / 2 where the lanes share compute's cores, else
    ALONE)."""
    import torch

    from horizon_exec.measure.calibrate.kernels import ELEMENTWISE_MODEL, block_pass
    from horizon_exec.measure.calibrate.threads import _pin, thread_counts
    counts = thread_counts(len(cores))
    out: dict = {}

    def run():
        block = block_pass(ELEMENTWISE_MODEL, 1, 128, dtype, "cpu")

        def timed(t):
            torch.get_num_threads()  # ATen's lazy per-thread init first (CpuBackend.start_lane)
            torch.set_num_threads(t)
            _pin(cores[:t])
            t0 = time.perf_counter()
            block()
            return time.perf_counter() - t0
        for t in counts:
            timed(t)  # warm each count's thread team
        ratios = {t: [] for t in counts}
        for r in range(2):
            times = {t: timed(t) for t in (counts if r % 2 == 0 else counts[::-1])}
            for t in counts:
                ratios[t].append(times[base] / times[t])
        out["rows"] = tuple((float(t), statistics.median(ratios[t]),
                             statistics.median(ratios[t]) / (2.0 if t >= len(cores) else 1.0)) for t in counts)
    import threading
    th = threading.Thread(target=run, name="estimate-threads")
    th.start()
    th.join()
    if "rows" not in out:
        raise RuntimeError("the thread-scaling pass failed")
    return out["rows"]


def gpu_estimate(device: str) -> tuple[HardwareSpec, str]:
    """(the detected GPU's preset with its memory and this host's RAM and cores, one line saying
    which preset)."""
    from horizon_exec.measure.calibrate.cuda import preset_for
    from horizon_exec.measure.machine.detect import gpu, host_ram_GiB
    from horizon_sim.specs.hardware_presets import make_hardware
    from horizon_sim.units import GiB
    name, mem = gpu(device)
    preset = preset_for(name)
    hw = make_hardware(preset.name if preset else ESTIMATE_PRESET, ram=int(host_ram_GiB() * GiB))
    # runtime 0: not measured (the admission counts RSS + its growth estimate, as without a file)
    hw = replace(hw, device=replace(hw.device, hbm_GiB=mem),
                 host=replace(hw.host, cores=os.cpu_count() or 1, runtime_overhead_GiB=0.0),
                 name=f"{name} ({preset.name if preset else ESTIMATE_PRESET} preset) / {hw.host.name} host")
    what = (f"the {preset.name} preset" if preset else
            f"no preset names {name!r}: the {ESTIMATE_PRESET} preset's speeds")
    return hw, f"{what} with this GPU's {mem:.1f} GiB and this host's RAM and {hw.host.cores} cores"


def main() -> int:
    """Child process entry (`python -m horizon_exec.measure.machine.estimate`): one JSON line
    {"toml": the estimate as a hardware file, "seconds": measuring time}."""
    import json

    from horizon_sim.specs.hardware_io import hardware_to_toml
    sys.stdin.read()  # the request carries nothing yet
    t0 = time.perf_counter()
    hw = cpu_estimate()
    print(json.dumps({"toml": hardware_to_toml(hw), "seconds": time.perf_counter() - t0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
