"""`horizon calibrate`: measure this machine for the executor and write a HardwareSpec TOML that
`horizon plan/simulate/validate --hardware` read. Needs torch (imported only when it runs).

A full calibration (not --quick) is also kept in the per-user cache
(horizon_exec/measure/machine/cache.py: ~/.cache/horizon/machines/<machine key>.toml), where
`horizon train` finds it for this machine when no --hardware is given; -o writes a copy
where you want one (without -o only the cache is written), --no-cache skips the cache."""
import argparse
import json
from pathlib import Path

from horizon_exec.measure.arg_bounds import check_calibrate
from horizon_exec.cli.needs_exec import import_executor, say
from horizon_sim.errors import HorizonError

EXAMPLE = """example:
  horizon calibrate                                  # this machine, kept in ~/.cache/horizon/machines for `train`
  horizon calibrate -o machine.toml                  # CPU backend (and the cache): 1.5-10 min on 2 cores
  horizon calibrate --quick -o /tmp/quick.toml       # smaller grids, a few seconds
  horizon calibrate --device cuda -o gpu.toml        # a GPU box
  horizon calibrate --model tiny --batch 4 --seq 128 -o machine.toml   # + that model's exact GEMM shapes"""


def configure(p: argparse.ArgumentParser) -> None:
    p.description = ("Measure the machine this runs on, for the executor's backend, and write a hardware "
                     "file. CPU backend: GEMM throughput by shape and layout at the executor's compute "
                     "threads, causal attention kernels, the template's elementwise bandwidth, fixed cost per "
                     "op kind, one copy thread's bandwidth, how lanes sharing cores slow each other, the AdamW "
                     "op's rate, the process's runtime RSS. CUDA: pinned and pageable h2d/d2h bandwidth and "
                     "latency, GEMM throughput by shape, attention, per-op overheads. Progress goes to stderr.")
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("-o", "--output", default=None, metavar="FILE.toml",
                   help="also write the hardware file here (default: only the per-user cache, "
                        "~/.cache/horizon/machines, that `horizon train` reads)")
    p.add_argument("--no-cache", action="store_true",
                   help="do not keep the calibration in the per-user cache (--quick never does)")
    p.add_argument("--device", default=None,
                   help="cpu or cuda[:N] (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--quick", action="store_true", help="small grids and one round (for tests; less accurate)")
    p.add_argument("--rounds", type=int, default=None,
                   help="repeats of the noise-prone measurements, spread over the run (default 3, quick 1)")
    p.add_argument("--model", default=None,
                   help="also measure the exact GEMM shapes of this model (preset or config.json) under "
                        "--batch/--seq/--micro-batches")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--disk-dir", default=None, metavar="DIR",
                   help="a folder on the disk the disk tier would use (train --disk-dir): its read and write "
                        "bandwidth and free space are measured (default: the system temp dir)")
    p.add_argument("--disk-io", choices=("direct", "buffered"), default="direct",
                   help="the disk tier's I/O to measure, as train --disk-io (default direct)")
    p.add_argument("--json", action="store_true", help="print the spec as JSON instead of a summary")


def run(a: argparse.Namespace) -> int:
    out = Path(a.output) if a.output else None
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        raise HorizonError(f"-o {a.output!r}: give a file in an existing folder")
    if out is None and (a.quick or a.no_cache):
        raise HorizonError("give -o FILE.toml: " + ("a --quick calibration is not kept in the per-user cache"
                                                   if a.quick else "--no-cache writes nothing else"))
    check_calibrate(a)  # every bound (and --disk-dir) before anything is measured
    if out is None:  # the cache is the only output: it must be usable before minutes of measuring
        from horizon_exec.measure.machine.cache import cache_dir, private_cache_dir
        from horizon_exec.private_dir import NotPrivate
        try:
            private_cache_dir()
        except (NotPrivate, OSError) as e:
            why = getattr(e, "strerror", None) or e
            raise HorizonError(f"the per-user cache {cache_dir()} cannot be used ({why}); give -o FILE.toml") from None
    model = policy = None
    if a.model:
        from horizon_sim.specs.hf_config import load_model
        from horizon_sim.specs.policy import Policy
        model = load_model(a.model)
        policy = Policy(batch=a.batch, seq=a.seq, micro_batches=a.micro_batches)
    calibrate = import_executor("horizon_exec.measure.calibrate", "calibrate").calibrate
    from horizon_exec.cli.default_device import resolve_device
    from horizon_sim.specs.hardware_io import save_hardware
    a.device, why = resolve_device(a.device)
    if why:
        say(why)  # stderr, with the progress: stdout may be --json
    hw = calibrate(a.device, quick=a.quick, model=model, policy=policy, rounds=a.rounds, say=say,
                   disk_dir=a.disk_dir, disk_io=a.disk_io)
    if out is not None:
        save_hardware(hw, out)
    cached = _keep_in_cache(hw, a)
    if a.json:
        print(json.dumps({"output": str(out or cached), "cached": cached, **hw.to_dict()}))
        return 0
    d, l, h = hw.device, hw.link, hw.host
    print(f"wrote {', '.join(str(p) for p in (out, cached) if p)}: {hw.name}")
    # the best bf16 shape measured, not bf16_TFLOPs (on a GPU: the datasheet peak, kept for MFU)
    best = max((r[5] for r in d.gemm_TFLOPs if r[0] == "bf16"), default=d.bf16_TFLOPs * d.matmul_efficiency)
    fp32 = max((r[5] for r in d.gemm_TFLOPs if r[0] == "fp32"), default=0.0)
    print(f"  device  {d.name}: bf16 GEMM up to {best * 1e3:.0f} GFLOP/s measured"
          + (f" (fp32 {fp32 * 1e3:.0f})" if fp32 else "") + f" ({len(d.gemm_TFLOPs)} shapes), "
          f"elementwise {d.hbm_GBps:.1f} GB/s, op overheads "
          + ", ".join(f"{k} {v:.0f} us" for k, v in d.op_overhead_us)
          + (f", math-library workspaces {d.library_workspace_MiB:.0f} MiB" if d.library_workspace_MiB else ""))
    print(f"  link    {l.name}: h2d {l.h2d_GBps:.1f} GB/s, d2h {l.d2h_GBps:.1f} GB/s, latency {l.latency_us:.0f} us"
          + (f" (+{l.busy_latency_us:.0f} us next to a busy compute lane)" if l.busy_latency_us else ""))
    print(f"  host    {h.name}: {h.ram_GiB:.1f} GiB RAM, {h.cores} cores, AdamW {h.adam_Gparams_per_s:.2f} G params/s, "
          f"DRAM {h.dram_GBps:.1f} GB/s" + (f" ({h.thread_GBps:.1f} from one thread)" if h.thread_GBps else "")
          + f", runtime RSS {h.runtime_overhead_GiB * 1024:.0f} MiB")
    c = hw.cluster
    if c.fabric_GBps:
        print(f"  ranks   {c.name}: {c.fabric_GBps:.2f} GB/s, {c.fabric_latency_us:.0f} us a ring step "
              "(horizon plan --hardware FILE --gpus N plans N data-parallel processes here)")
    return 0


def _keep_in_cache(hw, a: argparse.Namespace) -> str | None:
    """The per-user cache's copy of a full calibration (where `horizon train` looks for this
    machine's), its path as shown; None for --quick or --no-cache. A cache folder that is not
    private (or cannot be made) is said, and only -o is written (without -o: an error)."""
    if a.quick or a.no_cache:
        return None
    from horizon_exec.measure.machine import save_calibration
    from horizon_exec.private_dir import NotPrivate
    try:
        return save_calibration(hw, a.device)
    except (NotPrivate, OSError) as e:
        why = f"not kept in the per-user cache: {getattr(e, 'strerror', None) or e}"
        if a.output is None:
            raise HorizonError(f"the calibration is {why}; give -o FILE.toml") from None
        say(f"calibrate: {why}")
        return None
