"""The CUDA backend's calibration: the GPU's kernels, the real link's copies (pinned and pageable),
AdamW and the bus on all host cores.

Kernel timing on the GPU: a host timer around one call followed by a synchronize measures the
launch and the synchronize (tens of microseconds) as much as the kernel, more than a small or
medium GEMM or attention call takes, while the executor's lanes queue kernels back to back.
GEMMs and attention are therefore timed with CUDA events around a batch of back-to-back calls
(_device_seconds); the elementwise bandwidth keeps the per-kernel KernelTimer (it must sort
kernels by kind) at token counts large enough that each kernel's bytes, not its fixed cost,
set the slope between the two sizes."""
import os
import re
import statistics
import time
from dataclasses import replace

import torch

from horizon_exec.measure.calibrate.disk import disk_host_fields
from horizon_exec.measure.calibrate.host import (bus_capacity_GBps, measure_accumulate_GBps, measure_adam_Gparams,
                                                 measure_bus_GBps, os_reserved_GiB, ram_GiB)
from horizon_exec.measure.calibrate.kernels import (ColdOperands, attention_calls, attention_grid, fp32_gemm_shapes,
                                            gemm_shapes, measure_dequant_ns, measure_elementwise,
                                            measure_loss_ns_per_logit, slope_GBps)
from horizon_exec.measure.calibrate.overheads import (HEAD8_POLICY, LORA_POLICY, MOE_EXPERTS, MOE_POLICY, TINY,
                                                      TINY_POLICY, adapter_overheads, head_chunk_us, measured_rows, moe_overheads, op_overheads, tiny_moe,
                                                      tiny_op_times)
from horizon_exec.measure.calibrate.timing import Progress, median_time
from horizon_exec.procfs import cpu_name
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
from horizon_sim.units import GiB, MiB


def _device_seconds(fn, *, min_s: float = 0.01, max_reps: int = 200, batches: int = 3) -> float:
    """GPU seconds per call of fn() when calls are queued back to back on the current stream:
    CUDA events around a batch (reps sized to fill ~min_s), the median over `batches`."""
    fn()  # warm-up: the library picks its kernel, the allocator its blocks
    torch.cuda.synchronize()

    def batch(reps: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    reps = int(min(max_reps, max(1, min_s / max(batch(1), 1e-7))))
    return statistics.median(batch(reps) for _ in range(batches))


def gemm_table(shapes, dtype, device) -> dict:
    """{(layout, m, n, k): TFLOP/s} of torch.mm on the GPU, event-timed (see the module docstring)."""
    out = {}
    for shape in shapes:
        layout, m, n, k = shape
        fn = ColdOperands(layout, m, n, k, dtype, device, 0)  # one operand set off the CPU
        out[shape] = 2.0 * m * n * k / _device_seconds(fn) / 1e12
        del fn
    return out


def attention_rates(seq: int, hd: int, dtype, device, heads: int = 8, kv_heads: int = 4,
                    masked: bool = False) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of the causal SDPA as the template calls it (strided heads,
    grouped kv), against the nominal FLOPs of kernels.measure_attention; event-timed, the
    backward as (forward with grad + autograd.grad) less the forward. Unlike a per-kernel
    timer keyed on kernel names, this does not divide by zero when SDPA falls back to its
    math path (GPUs before sm80, where the fused kernels are missing)."""
    return _fwd_bwd_rates(*attention_calls(seq, hd, dtype, device, heads, kv_heads, 16384, masked))


def _fwd_bwd_rates(fwd, fwd_bwd, nominal: float) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of an attention kernel: fwd() and fwd_bwd() event-timed, the
    backward as their difference, against `nominal` forward FLOPs (the backward's: twice)."""
    t_f = _device_seconds(fwd, max_reps=50)
    t_b = max(_device_seconds(fwd_bwd, max_reps=50) - t_f, 0.1 * t_f)
    return nominal / t_f / 1e12, 2.0 * nominal / t_b / 1e12


SOFTCAP_GRID = ((2048, 128), (2048, 256), (8192, 128), (8192, 256))
"""(seq, head_dim) where the fused soft-capped attention is timed: Gemma 2's head widths (256:
2B and 9B; 128: 27B) at a short and its full 8,192-token context. Each shape compiles its own
kernels (~10 s), so the grid stays small; the cost model interpolates between rows."""


def softcap_attention_rates(seq: int, hd: int, dtype, device, heads: int = 8,
                            kv_heads: int = 4) -> tuple[float, float] | None:
    """(forward, backward) TFLOP/s of the soft-capped attention's fused kernel (flex_softcap.py,
    causal, cap 50) against attention_rates' nominal causal count; None where this torch has
    no flex_attention (the planner then prices it at the SDPA rate)."""
    from horizon_exec.model import flex_softcap
    batch = max(1, 16384 // seq)
    q = torch.randn(batch, heads, seq, hd, device=device, dtype=dtype)
    if not flex_softcap.usable(q):
        return None
    k, v = (torch.randn(batch, kv_heads, seq, hd, device=device, dtype=dtype) for _ in range(2))
    go = torch.randn_like(q)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def fwd():
        with torch.no_grad():
            flex_softcap.flex_softcap_attention(q, k, v, hd ** -0.5, 50.0)

    def fwd_bwd():
        o = flex_softcap.flex_softcap_attention(qg, kg, vg, hd ** -0.5, 50.0)
        torch.autograd.grad(o, [qg, kg, vg], go)
    return _fwd_bwd_rates(fwd, fwd_bwd, 2.0 * batch * heads * seq * seq * hd)


def _library_workspace_bytes(dev_t) -> int:
    """Device bytes the math libraries take for a stream at its first matmuls and keep (the
    cuBLAS and cuBLASLt workspaces, one set per handle and stream): what the executor's compute
    stream holds under every step. Its forward products run on the lane's thread, its backward
    ones on autograd's device thread, which has a cuBLAS handle of its own: an H200 (torch 2.11)
    held 64 MiB in the executor, 33 MiB for the forward kinds alone. Measured on a fresh stream,
    the products themselves freed."""
    leaves = [(torch.ones(256, 256, device=dev_t, dtype=dt, requires_grad=True),
               torch.ones(256, device=dev_t, dtype=dt, requires_grad=True)) for dt in (torch.bfloat16, torch.float32)]
    s = torch.cuda.Stream(dev_t)
    torch.cuda.synchronize(dev_t)
    before = torch.cuda.memory_allocated(dev_t)
    with torch.cuda.stream(s):  # the executor's kinds of product: mm, linear with a bias (Lt), backward
        for x, b in leaves:
            y = torch.nn.functional.linear(x @ x, x, b)
            torch.autograd.grad(y.sum(), (x, b))
            del y
    torch.cuda.synchronize(dev_t)
    return max(0, torch.cuda.memory_allocated(dev_t) - before)


def preset_for(gpu_name: str):
    """The DeviceSpec preset whose name's words all appear in the GPU's name (the most specific
    one), e.g. 'NVIDIA A100-SXM4-80GB' -> a100-80gb; None if none does. Words, not substrings:
    'h200' must not match 'NVIDIA GH200 480GB'."""
    from horizon_sim.specs.hardware_presets import DEVICES
    words = set(re.split(r"[^a-z0-9]+", gpu_name.lower())) - {""}
    if {"h100", "hbm3"} <= words:  # the SXM part reports itself as 'NVIDIA H100 80GB HBM3'
        words.add("sxm")
    best = None
    for p in DEVICES.values():
        want = set(re.split(r"[^a-z0-9]+", p.name.lower())) - {""}
        if want <= words and (best is None or len(want) > best[0]):
            best = (len(want), p)
    return best[1] if best else None


def calibrate_cuda(device, quick, model, policy, say, rounds, disk=(None, "direct")) -> HardwareSpec:
    """The CUDA backend: copies are DMA over the real link (pinned and pageable), compute is
    the GPU, the optimizer runs on all host cores. Not exercised on the machine this was
    written on (no GPU); the CPU path is the one validated."""
    if not torch.cuda.is_available():
        raise HorizonError(f"device {device!r}: torch sees no CUDA device here")
    dev_t = torch.device(device)
    if dev_t.index is None:
        dev_t = torch.device("cuda", torch.cuda.current_device())
    # Events, synchronize() and the caching allocator's counters below use the current device.
    with torch.cuda.device(dev_t):
        return _calibrate_on(device, dev_t, quick, model, policy, say, rounds, disk)


def _calibrate_on(device, dev_t, quick, model, policy, say, rounds, disk) -> HardwareSpec:
    from horizon_exec.measure.probe import probe
    sync = lambda: torch.cuda.synchronize(dev_t)  # noqa: E731
    prog = Progress(total=7, say=say)
    props = torch.cuda.get_device_properties(dev_t)
    t_start = time.perf_counter()

    prog.step(f"GEMM throughput on {props.name}")
    shapes = gemm_shapes(quick, "cuda", model, policy)
    bf16 = gemm_table(shapes, torch.bfloat16, dev_t)
    fp32 = gemm_table(fp32_gemm_shapes(quick, "cuda"), torch.float32, dev_t)
    gemm = [("bf16", s[0], *map(float, s[1:]), r) for s, r in bf16.items()]
    gemm += [("fp32", s[0], *map(float, s[1:]), r) for s, r in fp32.items()]

    prog.step("attention kernels (SDPA; soft-capped: flex_attention) and elementwise bandwidth")
    attn, mattn = [], []
    for seq, hd in attention_grid(quick, "cuda"):
        f, b = attention_rates(seq, hd, torch.bfloat16, dev_t)
        attn.append(("bf16", float(seq), float(hd), f, b))
        f, b = attention_rates(seq, hd, torch.bfloat16, dev_t, masked=True)
        mattn.append(("bf16", float(seq), float(hd), f, b))
    sattn = []
    for seq, hd in (SOFTCAP_GRID[:1] if quick else SOFTCAP_GRID):
        rates = softcap_attention_rates(seq, hd, torch.bfloat16, dev_t)
        if rates is not None:
            sattn.append(("bf16", float(seq), float(hd), *rates))
    # At the CPU's sizes (<= 1024 tokens, ~1 MB a kernel) a GPU is launch-bound: the slope
    # between them would be noise. These move tens of MB per kernel.
    elem = slope_GBps(measure_elementwise(torch.bfloat16, dev_t, quick, sync,
                                          sizes=((2, 512), (8, 512)) if quick else ((8, 1024), (32, 1024))))
    loss_ns = measure_loss_ns_per_logit(32768, 4096, torch.bfloat16, dev_t, sync)
    dequant = measure_dequant_ns(2**26 if not quick else 2**24, dev_t, sync)  # a quantized base's loads

    prog.step("link: pinned and pageable h2d/d2h bandwidth, latency")
    n = 256 * 2**20 if not quick else 32 * 2**20
    d = torch.empty(n, dtype=torch.uint8, device=dev_t)
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    pageable = torch.empty(n, dtype=torch.uint8)
    h2d = n / median_time(lambda: d.copy_(pinned, non_blocking=True), sync=sync) / 1e9
    d2h = n / median_time(lambda: pinned.copy_(d, non_blocking=True), sync=sync) / 1e9
    pg = n / median_time(lambda: d.copy_(pageable), sync=sync) / 1e9
    small_d, small_h = d[:4096], pinned[:4096]
    lat = median_time(lambda: small_d.copy_(small_h, non_blocking=True), sync=sync) * 1e6

    prog.step("host: AdamW on all cores, DRAM bus")
    torch.set_num_threads(os.cpu_count() or 1)
    adam = measure_adam_Gparams(2**24 if not quick else 2**21, quick)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    bus = bus_capacity_GBps(measure_bus_GBps(64 * 2**20, cores), adam)
    # The CPU lane's gathers, scatters and reductions (embedding rows, host-gradient sums), at
    # the intra-op threads its torch calls get: without it they were priced at the whole bus.
    thread = measure_accumulate_GBps(2**24 if not quick else 2**21)
    ram = ram_GiB()

    # What the driver reports in use that this process's tensors are not: the CUDA context,
    # libraries, other processes. Without returning the caching allocator's blocks (GBs after
    # the GEMM grid and the loss kernels) mem_get_info counted them as reserved for good.
    del d, pinned, pageable, small_d, small_h
    sync()
    library_ws = _library_workspace_bytes(dev_t)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(dev_t)
    not_ours = max(0, total - free - torch.cuda.memory_reserved(dev_t))
    preset = preset_for(props.name)
    bf16_best, fp32_best = max(bf16.values()), max(fp32.values())
    peak = max(preset.bf16_TFLOPs, bf16_best) if preset else bf16_best
    devspec = DeviceSpec(name=props.name, hbm_GiB=props.total_memory / GiB, bf16_TFLOPs=peak,
                         fp32_TFLOPs=max(preset.fp32_TFLOPs, fp32_best) if preset else fp32_best,
                         hbm_GBps=elem, default_link="calibrated", matmul_efficiency=min(1.0, bf16_best / peak),
                         reserved_GiB=not_ours / GiB + 0.5, library_workspace_MiB=library_ws / MiB,
                         launch_overhead_us=lat, loss_ns_per_logit=loss_ns, dequant_ns_per_param=dequant,
                         gemm_TFLOPs=tuple(gemm), attention_TFLOPs=tuple(attn),
                         masked_attention_TFLOPs=tuple(mattn), softcap_attention_TFLOPs=tuple(sattn))
    link = LinkSpec(name="calibrated", h2d_GBps=h2d, d2h_GBps=d2h, latency_us=lat, pageable_GBps=pg)
    hst = HostSpec(name=cpu_name(), ram_GiB=ram, dram_GBps=bus, cores=os.cpu_count() or 1,
                   adam_Gparams_per_s=adam, os_reserved_GiB=os_reserved_GiB(ram), thread_GBps=thread)
    hw = HardwareSpec(device=devspec, link=link, host=hst)

    prog.step("fixed cost per op: a tiny model, ops serialized")
    own = tiny_op_times(device, 4)
    comp_us, copy_us, host_us = op_overheads(hw, own)
    comp_us["head_chunk"] = head_chunk_us(own, tiny_op_times(device, 4, HEAD8_POLICY))
    comp_us = measured_rows(comp_us)
    comp_us |= moe_overheads(hw, comp_us, {e: tiny_op_times(device, 4, MOE_POLICY, tiny_moe(e)) for e in MOE_EXPERTS})
    comp_us |= adapter_overheads(hw, comp_us, tiny_op_times(device, 4, LORA_POLICY))
    res = probe(TINY, TINY_POLICY, steps=2, warmup=1, device=device)
    runtime = max(res["rss_peak_bytes"] - res["store_bytes"] - res["host_dynamic_peak_bytes"], 0) / GiB
    disk = disk_host_fields(disk, quick, prog)
    prog.step("assemble the HardwareSpec")
    hw = HardwareSpec(device=replace(devspec, op_overhead_us=tuple(sorted(comp_us.items()))),
                      link=replace(link, latency_us=max(lat, copy_us)),
                      host=replace(hst, op_latency_us=host_us, runtime_overhead_GiB=runtime, **disk),
                      name=f"{props.name} / {hst.name} (calibrated {time.strftime('%Y-%m-%d %H:%M')})")
    prog.done(f"total {time.perf_counter() - t_start:.0f} s")
    return hw
