"""The CPU backend's calibration: every figure measured in a thread set up like the lane that
will do the work, the noise-prone ones over rounds spread across the run."""
import os
import statistics
import time
from dataclasses import replace

import torch

from horizon_exec.device.compute_dtype import default_compute_dtype
from horizon_exec.dtypes import TORCH_DTYPE
from horizon_exec.measure.calibrate.collectives import measure_loopback
from horizon_exec.measure.calibrate.contention import busy_latencies, compute_slowdown
from horizon_exec.measure.calibrate.disk import disk_host_fields
from horizon_exec.measure.calibrate.host import (bus_capacity_GBps, os_reserved_GiB, measure_accumulate_GBps, measure_adam_Gparams,
                                         measure_bus_GBps, measure_copy_GBps, measure_reduce_GBps,
                                         measure_shared_cores, ram_GiB)
from horizon_exec.measure.calibrate.kernels import (attention_grid, fp32_gemm_shapes, gemm_rates,
                                            gemm_shapes, gemm_times,
                                            measure_attention, measure_cpu_loss_figures, measure_dequant_ns,
                                            measure_elementwise, model_gemms,
                                            slope_GBps, visit_speeds)
from horizon_exec.measure.calibrate.overheads import (HEAD8_POLICY, MOE_EXPERTS, MOE_POLICY, TINY, TINY_POLICY,
                                              LORA_POLICY, TinyProbe, adapter_overheads, head_chunk_us, measured_rows,
                                              moe_overheads, op_overheads,
                                              runtime_overhead_GiB, tiny_moe, tracked_overheads)
from horizon_exec.measure.calibrate.kernel_threads import measure_kernel_speeds
from horizon_exec.measure.calibrate.threads import measure_thread_speeds, thread_counts
from horizon_exec.measure.calibrate.timing import Progress, in_lane, mean_rate
from horizon_exec.procfs import cpu_name
from horizon_sim.schedule import Lane, OpKind
from horizon_sim.sim.costs import COPY_TRAFFIC
from horizon_sim.specs.cluster import ClusterSpec
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
from horizon_sim.specs.policy import Policy


def _elem_points(rounds) -> list:
    """(mean seconds, bytes) at the small and the large token count, over the rounds so far."""
    return [(statistics.mean(x[i][0] for x in rounds), rounds[0][i][1]) for i in (0, 1)]


BF16_FALLBACK_RATIO = 8.0
"""bf16 GEMMs this many times slower than fp32 ones: no native bf16 arithmetic here."""


def _bf16_fallback() -> bool:
    """Does a 256^3 bf16 GEMM take over BF16_FALLBACK_RATIO x an fp32 one (best of 3 each)?"""
    t = {}
    for dt in (torch.float32, torch.bfloat16):
        a, b = torch.randn(256, 256, dtype=dt), torch.randn(256, 256, dtype=dt)
        a @ b
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        t[dt] = best
    return t[torch.bfloat16] > BF16_FALLBACK_RATIO * t[torch.float32]


def calibrate_cpu(quick, model, policy, say, rounds, disk=(None, "direct")) -> HardwareSpec:
    from horizon_exec.device.cpu import CpuBackend, cpu_cores
    from horizon_exec.measure.probe import probe
    t_start = time.perf_counter()
    cores = cpu_cores()
    backend = CpuBackend()  # cores - 1: the base split every rate below is measured at
    prog = Progress(total=7 + rounds, say=say)
    compute = lambda fn: in_lane(backend, Lane.COMPUTE, fn)  # noqa: E731
    host = lambda fn: in_lane(backend, Lane.CPU, fn)         # noqa: E731

    # A CPU without native bf16 arithmetic (no AVX-512: torch's bf16 GEMM falls back to a
    # generic kernel, ~60x slower than fp32 on an AVX2 EPYC): the small bf16 grid, and say so.
    # gemm_times measures it as a bf16 run computes there, through fp32 (device/bf16_gemm.py);
    # no default run computes in bf16 there, and its full grid at fp32's rates took minutes.
    slow_bf16 = compute(_bf16_fallback)
    # What `horizon train` computes in here by default: bf16, or fp32 on a CPU without bf16 matrix
    # instructions. Its attention is measured in that dtype too (an fp32 step priced from bf16
    # attention rows, or from fp32's peak at bf16's GEMM efficiency, came out twice the measured
    # step on an AVX2 EPYC), and the thread scaling is measured in it: a bf16 GEMM without those
    # instructions hardly gains from a second thread, an fp32 one nearly doubles.
    run_dtype = default_compute_dtype("cpu")[0]
    attn_dtypes = ("bf16", "fp32") if run_dtype == "fp32" else ("bf16",)
    # --model's own GEMMs in the dtype its default run computes in (bf16's generic kernel would
    # take minutes over them, and no default run here computes in it)
    own = (model, policy) if run_dtype == "bf16" else (None, None)
    shapes = gemm_shapes(quick or slow_bf16, "cpu", *own)
    fp32_shapes = fp32_gemm_shapes(quick or slow_bf16, "cpu")
    if run_dtype == "fp32" and model is not None:
        fp32_shapes = sorted(set(fp32_shapes) | model_gemms(model, policy or Policy()))
    prog.step(f"GEMM library warm-up: {len(shapes)} bf16 shapes, {len(fp32_shapes)} fp32 on "
              f"{backend.compute_threads} thread(s) of core(s) {backend.compute_cores}"
              + (" (no native bf16 GEMMs here, a bf16 run's go through fp32: the small bf16 grid)"
                 if slow_bf16 and not quick else ""))
    gemm_visits = [compute(lambda: gemm_times(shapes, torch.bfloat16, "cpu"))]  # the rates only when no round visits
    fp32_visits = [compute(lambda: gemm_times(fp32_shapes, torch.float32, "cpu"))]
    run_visits = fp32_visits if run_dtype == "fp32" else gemm_visits  # the grid a default run's GEMMs come from

    ram = ram_GiB()
    tiny = [TinyProbe("cpu"), TinyProbe("cpu", HEAD8_POLICY),
            *(TinyProbe("cpu", MOE_POLICY, tiny_moe(e)) for e in MOE_EXPERTS),
            TinyProbe("cpu", LORA_POLICY),  # adapters on every projection
            TinyProbe("cpu", track_memory="every")]  # what tracking every op every run costs

    def sample_tiny():
        for t in tiny:
            t.sample(1)
    sample_tiny()
    attn_pts = attention_grid(quick, "cpu")
    attn_keys = [(dt, *p) for dt in attn_dtypes for p in attn_pts]
    R: dict = {"attn": {k: [] for k in attn_keys}, "mattn": {k: [] for k in attn_keys}, "elem": [], "h2d": [], "d2h": [], "thread": [],
               "reduce": [], "adam": [], "slowdown": [], "loss": [], "dequant": []}
    layer_bytes = 4 * 2**20 if not quick else 2**20
    for r in range(rounds):
        prog.step(f"round {r + 1}/{rounds}: GEMM grid (cold operands), attention kernels, elementwise "
                  "bandwidth, copies, AdamW, per-op fixed costs (a tiny model, ops serialized)")
        sample_tiny()
        # One more visit of the grid per round, alternating direction; the rates come from these
        # alone, not from the first visit, which warms the GEMM library up: taken alone, as it was
        # where bf16 GEMMs were slow, it read a through-fp32 bf16 table up to 1.34x slower than
        # the validation after it measured the same shapes (drift.py).
        if not quick:
            gemm_visits.append(compute(lambda: gemm_times(shapes, torch.bfloat16, "cpu", reverse=r % 2 == 0)))
            sample_tiny()
        if not quick and run_dtype == "fp32":  # the dtype default runs compute in: visited as bf16's grid is
            fp32_visits.append(compute(lambda: gemm_times(fp32_shapes, torch.float32, "cpu", reverse=r % 2 == 0)))
            sample_tiny()
        for dt, seq, hd in attn_keys:
            R["attn"][(dt, seq, hd)].append(compute(lambda: measure_attention(seq, hd, TORCH_DTYPE[dt], "cpu")))
            R["mattn"][(dt, seq, hd)].append(compute(lambda: measure_attention(seq, hd, TORCH_DTYPE[dt], "cpu",
                                                                               masked=True)))
        sample_tiny()
        R["elem"].append(compute(lambda: measure_elementwise(torch.bfloat16, "cpu", quick)))
        R["loss"].append(measure_cpu_loss_figures(2048 if quick else 8192, compute))  # (torch, fused)
        R["h2d"].append(host(lambda: measure_copy_GBps(layer_bytes, "h2d")))
        R["d2h"].append(host(lambda: measure_copy_GBps(layer_bytes, "d2h")))
        R["thread"].append(host(lambda: measure_accumulate_GBps(layer_bytes // 2)))
        R["reduce"].append(host(lambda: measure_reduce_GBps(layer_bytes // 2)))
        R["adam"].append(host(lambda: measure_adam_Gparams(2**21 if not quick else 2**19, quick)))
        R["dequant"].append(host(lambda: measure_dequant_ns(2**22 if not quick else 2**20)))  # a load's lane
        sample_tiny()
        R["slowdown"].append(compute_slowdown(backend, quick))
        g = gemm_rates(run_visits[-1:])
        prog.done(f"{run_dtype} GEMM median {statistics.median(g.values()) * 1e3:.0f} GFLOP/s, elementwise "
                  f"{slope_GBps(_elem_points(R['elem'])):.1f} GB/s, h2d {R['h2d'][-1]:.1f} GB/s, AdamW {R['adam'][-1]:.2f} G params/s")
    bf16, fp32 = gemm_rates(gemm_visits[1:] or gemm_visits), gemm_rates(fp32_visits[1:] or fp32_visits)
    gemm = [("bf16", s[0], *map(float, s[1:]), r) for s, r in bf16.items()]
    gemm += [("fp32", s[0], *map(float, s[1:]), r) for s, r in fp32.items()]
    bf16_best, fp32_best = max(bf16.values()), max(fp32.values())
    shared = measure_shared_cores(backend, layer_bytes, 2 * len(backend.host_cores))
    bus = measure_bus_GBps(64 * 2**20 if not quick else 8 * 2**20,
                           sorted(set(backend.compute_cores) | set(backend.host_cores)))
    attn, mattn = [], []
    for out, key in ((attn, "attn"), (mattn, "mattn")):
        for (dt, seq, hd), vals in R[key].items():
            out.append((dt, float(seq), float(hd), mean_rate([v[0] for v in vals]),
                        mean_rate([v[1] for v in vals])))
    elem = _elem_points(R["elem"])
    h2d, d2h = mean_rate(R["h2d"]), mean_rate(R["d2h"])
    dev = DeviceSpec(
        name=f"cpu-core ({backend.compute_threads} thread{'s' if backend.compute_threads > 1 else ''})",
        hbm_GiB=ram, bf16_TFLOPs=bf16_best, fp32_TFLOPs=fp32_best, hbm_GBps=slope_GBps(elem),
        default_link="cpu-threads", matmul_efficiency=statistics.median(bf16.values()) / bf16_best,
        reserved_GiB=0.0, launch_overhead_us=0.0, reduce_GBps=mean_rate(R["reduce"]),
        loss_ns_per_logit=statistics.mean(t for t, _ in R["loss"]),
        fused_loss_ns_per_logit=statistics.mean(f for _, f in R["loss"]),
        dequant_ns_per_param=tuple((fmt, statistics.mean(dict(r)[fmt] for r in R["dequant"]))
                                   for fmt, _ in R["dequant"][0]),
        gemm_TFLOPs=tuple(gemm), attention_TFLOPs=tuple(attn), masked_attention_TFLOPs=tuple(mattn))
    slowdown = statistics.mean(R["slowdown"])
    link = LinkSpec(name="cpu-threads", h2d_GBps=h2d, d2h_GBps=d2h, latency_us=0.0, pageable_GBps=h2d,
                    cpu_driven=True)
    dram = bus_capacity_GBps(bus, mean_rate(R["adam"]), COPY_TRAFFIC * h2d, COPY_TRAFFIC * d2h)  # a copied byte: read, written
    hst = HostSpec(name=cpu_name(), ram_GiB=ram, dram_GBps=dram, cores=os.cpu_count() or 1,
                   adam_Gparams_per_s=mean_rate(R["adam"]),
                   os_reserved_GiB=os_reserved_GiB(ram),
                   runtime_overhead_GiB=0.0, lane_cores=min(float(len(backend.host_cores)), shared),
                   thread_GBps=mean_rate(R["thread"]))
    hw = HardwareSpec(device=dev, link=link, host=hst)
    for t in tiny:
        t.close()
    comp_us, copy_us, host_us = op_overheads(hw, tiny[0].own)
    comp_us["head_chunk"] = head_chunk_us(tiny[0].own, tiny[1].own)
    tracked_us = op_overheads(hw, tiny[-1].own)[0]
    comp_us |= moe_overheads(hw, tracked_us, {e: t.own for e, t in zip(MOE_EXPERTS, tiny[2:2 + len(MOE_EXPERTS)])})
    comp_us |= adapter_overheads(hw, comp_us, tiny[2 + len(MOE_EXPERTS)].own)
    comp_us |= tracked_overheads(comp_us, tracked_us)
    comp_us = measured_rows(comp_us)

    hw = HardwareSpec(device=replace(dev, op_overhead_us=tuple(sorted(comp_us.items()))),
                      link=replace(link, latency_us=copy_us), host=replace(hst, op_latency_us=host_us))
    prog.step("lanes together: copies and CPU-lane ops next to a busy compute lane")
    busy = [busy_latencies(hw, "cpu", 2 if quick else 3) for _ in range(1 if quick else 2)]
    copy_busy = statistics.mean(b[0] for b in busy)
    host_busy = statistics.mean(b[1] for b in busy)
    reduces = [b[2] for b in busy if b[2] > 0]
    reduce = mean_rate(reduces) if reduces else dev.reduce_GBps
    prog.done(f"a copy takes {copy_busy:.0f} us longer, a CPU-lane op {host_busy:.0f} us; an offload's norm "
              f"pass runs at {reduce:.1f} GB/s in place (alone: {dev.reduce_GBps:.1f}); a host lane copying "
              f"without pause slows compute by {slowdown - 1:+.1%} (modelled while host-lane work runs)")
    prog.step(f"compute threads: the template block in {run_dtype} on 1..{len(cores)} thread(s), alone and beside "
              "a copying host lane (what a core split costs and gains)")
    speeds = measure_thread_speeds(cores, backend.compute_threads, quick, TORCH_DTYPE[run_dtype])
    # (in a lane's thread, as the executor's compute runs, never the main thread: a team left
    # there would slow every later team of this process: device/cpu.py, CpuBackend)
    kernel_speeds = compute(lambda: measure_kernel_speeds(cores, backend.compute_threads, quick,
                                                          thread_counts(len(cores)), TORCH_DTYPE[run_dtype]))
    prog.done(", ".join(f"{int(t)}: {a:.2f}x alone, {s:.2f}x beside a lane" for t, a, s in speeds)
              + "; kernels alone (GEMM, attention, elementwise): "
              + ", ".join(f"{int(t)}: {g:.2f}x {a:.2f}x {e:.2f}x" for t, g, a, e in kernel_speeds))
    prog.step("runtime RSS: a tiny model trained in a fresh process")
    res = probe(TINY, TINY_POLICY, steps=2, warmup=1)
    runtime = runtime_overhead_GiB(res)
    prog.done(", ".join(f"{k} {v:.0f} us" for k, v in comp_us.items())
              + f"; copies {copy_us:.0f} us, cpu-lane ops {host_us:.0f} us; runtime RSS {runtime * 1024:.0f} MiB; "
              f"host lanes share {shared:.2f} cores' worth, bus {bus:.1f} GB/s; bf16 GEMM best "
              f"{bf16_best * 1e3:.0f} GFLOP/s, median {statistics.median(bf16.values()) * 1e3:.0f}")

    prog.step("collectives: the executor's gloo reduce-scatter between two processes over loopback")
    coll_GBps, coll_us = measure_loopback(quick)
    cluster = ClusterSpec(name="loopback-gloo", fabric_GBps=coll_GBps, fabric_latency_us=coll_us,
                          net_GBps=coll_GBps, net_latency_us=coll_us)
    prog.done(f"{coll_GBps:.2f} GB/s per ring step, {coll_us:.0f} us latency (data-parallel CPU ranks: "
              "horizon plan --hardware FILE --gpus N)")

    disk = disk_host_fields(disk, quick, prog)
    prog.step("assemble the HardwareSpec")
    hw = HardwareSpec(
        device=replace(dev, op_overhead_us=tuple(sorted(comp_us.items())), reduce_GBps=reduce,
                       launch_overhead_us=comp_us.get(OpKind.FORWARD.value, 0.0),
                       compute_threads=backend.compute_threads, thread_speed=speeds,
                       thread_kernel_speed=kernel_speeds),
        link=replace(link, latency_us=copy_us, busy_latency_us=copy_busy),
        host=replace(hst, op_latency_us=host_us, runtime_overhead_GiB=runtime, busy_latency_us=host_busy,
                     compute_contention=max(0.0, slowdown - 1.0), **disk),
        cluster=cluster,
        name=f"{hst.name}, CPU backend: compute on {backend.compute_threads} core(s), lanes on "
             f"{len(backend.host_cores)} ({'quick ' if quick else ''}calibrated {time.strftime('%Y-%m-%d %H:%M')})")
    prog.done(f"total {time.perf_counter() - t_start:.0f} s" + _moved_text(run_visits))
    return hw


def _moved_text(visits: list[dict]) -> str:
    """'' when the rounds' visits of the GEMM grid ran at one speed (within validate's AGREE),
    else a note that the machine moved while it was measured: the rates are the visits' medians,
    and a plan on them carries that spread (a calibration taken in a slow minute priced a later
    default run 50% long)."""
    from horizon_exec.measure.validate.corrected import AGREE
    rounds = visits[1:]  # the warm-up visit is not a round's
    if len(rounds) < 2:
        return ""
    v = visit_speeds(rounds)
    if (max(v) - min(v)) / statistics.median(v) <= AGREE:
        return ""
    return (f"; the machine's speed moved while it was measured: the GEMM grid's {len(v)} visits ran at "
            f"{min(v):.2f}x-{max(v):.2f}x their median (the rates are the medians); `horizon calibrate` again "
            "on a quieter machine gives plans that hold better")
