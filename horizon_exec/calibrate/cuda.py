"""The CUDA backend's calibration: the GPU's kernels, the real link's copies (pinned and pageable),
AdamW and the bus on all host cores."""
import os
import time
from dataclasses import replace

import torch

from horizon_exec.calibrate.host import _cpu_name, os_reserved_GiB, measure_adam_Gparams, measure_bus_GBps, ram_GiB
from horizon_exec.calibrate.kernels import (_gemm_shapes, attention_grid, gemm_grid, measure_attention,
                                            measure_elementwise, measure_gemm_table, measure_loss_ns_per_logit,
                                            slope_GBps)
from horizon_exec.calibrate.overheads import TINY, TINY_POLICY, op_overheads, tiny_op_times
from horizon_exec.calibrate.timing import Progress, _median_time
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import work
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
from horizon_sim.units import GiB


def _calibrate_cuda(device, quick, model, policy, say, rounds) -> HardwareSpec:
    """The CUDA backend: copies are DMA over the real link (pinned and pageable), compute is
    the GPU, the optimizer runs on all host cores. Not exercised on the machine this was
    written on (no GPU); the CPU path is the one validated."""
    from horizon_exec.probe import probe
    if not torch.cuda.is_available():
        raise HorizonError(f"device {device!r}: torch sees no CUDA device here")
    dev_t = torch.device(device)
    sync = lambda: torch.cuda.synchronize(dev_t)  # noqa: E731
    prog = Progress(total=6, say=say)
    props = torch.cuda.get_device_properties(dev_t)
    t_start = time.perf_counter()

    prog.step(f"GEMM throughput on {props.name}")
    shapes = _gemm_shapes(quick, "cuda", model, policy)
    bf16 = measure_gemm_table(shapes, torch.bfloat16, dev_t, sync)
    fp32 = measure_gemm_table([(l, *s) for l in work.LAYOUTS for s in gemm_grid(True, "cuda")],
                              torch.float32, dev_t, sync, visits=1)
    gemm = [("bf16", s[0], *map(float, s[1:]), r) for s, r in bf16.items()]
    gemm += [("fp32", s[0], *map(float, s[1:]), r) for s, r in fp32.items()]

    prog.step("attention kernels and elementwise bandwidth")
    attn = []
    for seq, hd in attention_grid(quick, "cuda"):
        f, b = measure_attention(seq, hd, torch.bfloat16, dev_t, sync)
        attn.append(("bf16", float(seq), float(hd), f, b))
    elem = slope_GBps(measure_elementwise(torch.bfloat16, dev_t, quick, sync))
    loss_ns = measure_loss_ns_per_logit(32768, 4096, torch.bfloat16, dev_t, sync)

    prog.step("link: pinned and pageable h2d/d2h bandwidth, latency")
    n = 256 * 2**20 if not quick else 32 * 2**20
    d = torch.empty(n, dtype=torch.uint8, device=dev_t)
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    pageable = torch.empty(n, dtype=torch.uint8)
    h2d = n / _median_time(lambda: d.copy_(pinned, non_blocking=True), sync=sync) / 1e9
    d2h = n / _median_time(lambda: pinned.copy_(d, non_blocking=True), sync=sync) / 1e9
    pg = n / _median_time(lambda: d.copy_(pageable), sync=sync) / 1e9
    small_d, small_h = d[:4096], pinned[:4096]
    lat = _median_time(lambda: small_d.copy_(small_h, non_blocking=True), sync=sync) * 1e6

    prog.step("host: AdamW on all cores, DRAM bus")
    torch.set_num_threads(os.cpu_count() or 1)
    adam = measure_adam_Gparams(2**24 if not quick else 2**21, quick)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    bus = measure_bus_GBps(64 * 2**20, cores)
    ram = ram_GiB()

    from horizon_sim.specs.hardware_presets import DEVICES
    preset = next((p for p in DEVICES.values() if p.name.replace("-", " ") in props.name.lower()), None)
    bf16_best, fp32_best = max(bf16.values()), max(fp32.values())
    peak = max(preset.bf16_TFLOPs, bf16_best) if preset else bf16_best
    devspec = DeviceSpec(name=props.name, hbm_GiB=props.total_memory / GiB, bf16_TFLOPs=peak,
                         fp32_TFLOPs=max(preset.fp32_TFLOPs, fp32_best) if preset else fp32_best,
                         hbm_GBps=elem, default_link="calibrated", matmul_efficiency=min(1.0, bf16_best / peak),
                         reserved_GiB=(props.total_memory - torch.cuda.mem_get_info(dev_t)[0]) / GiB + 0.5,
                         launch_overhead_us=lat, loss_ns_per_logit=loss_ns,
                         gemm_TFLOPs=tuple(gemm), attention_TFLOPs=tuple(attn))
    link = LinkSpec(name="calibrated", h2d_GBps=h2d, d2h_GBps=d2h, latency_us=lat, pageable_GBps=pg)
    hst = HostSpec(name=_cpu_name(), ram_GiB=ram, dram_GBps=bus, cores=os.cpu_count() or 1,
                   adam_Gparams_per_s=adam, os_reserved_GiB=os_reserved_GiB(ram))
    hw = HardwareSpec(device=devspec, link=link, host=hst)

    prog.step("fixed cost per op: a tiny model, ops serialized")
    comp_us, copy_us, host_us = op_overheads(hw, tiny_op_times(device, 4))
    res = probe(TINY, TINY_POLICY, steps=2, warmup=1, device=device)
    runtime = max(res["rss_peak_bytes"] - res["store_bytes"] - res["host_dynamic_peak_bytes"], 0) / GiB
    prog.step("assemble the HardwareSpec")
    hw = HardwareSpec(device=replace(devspec, op_overhead_us=tuple(sorted(comp_us.items()))),
                      link=replace(link, latency_us=max(lat, copy_us)),
                      host=replace(hst, op_latency_us=host_us, runtime_overhead_GiB=runtime),
                      name=f"{props.name} / {hst.name} (calibrated {time.strftime('%Y-%m-%d %H:%M')})")
    prog.done(f"total {time.perf_counter() - t_start:.0f} s")
    return hw
