"""Any accumulation count (issue 44, item 2): how fast a step of many micro-batches is planned
and how far the extension (horizon_sim/sim/extend.py) lies from the full simulation.

1. In process, llama-3.1-8b (32 layers) on h100-sxm, 4 sequences of 2,048 per micro-batch, at
   several micro-batch counts, in the micro and the layer order: the extended plan
   (simulate_policy) beside the full simulation of the same step (the baseline: what the
   planner did up to 4,096 layer passes, and refused beyond), each timed once, interleaved; the
   ratio of their times and the extension's error on each figure ("(bound)": the timeline's own
   device peak was off its line at the counts simulated, and the plan stands the bound in for it).
2. `horizon plan --model llama-3.1-8b --gpu h100-sxm --ram 512GiB --batch 512 --micro-batches 128`
   (and 1024 / 256) as a whole process, advice included: median of 3 against the 2 s target.

Run: .venv/bin/python benchmarks/accumulation.py [--quick]   (--quick: counts up to 128)
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from horizon_sim.schedule import build_schedule  # noqa: E402
from horizon_sim.sim.simulate import simulate_full, simulate_policy  # noqa: E402
from horizon_sim.specs.hardware_presets import make_hardware  # noqa: E402
from horizon_sim.specs.model_presets import model_preset  # noqa: E402
from horizon_sim.specs.policy import Policy  # noqa: E402

TARGET_CLI_S = 2.0
SEQS_PER_MICRO = 4


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def compare(counts, orders=("micro", "layer")) -> None:
    model, hw = model_preset("llama-3.1-8b"), make_hardware("h100-sxm", "512GiB")
    print(f"{'order':<6}{'micro-batches':>14}{'simulated':>14}{'extended s':>12}{'full s':>9}{'speed-up':>9}"
          f"{'step err':>10}{'bound err':>10}{'host err':>10}{'timeline-peak err':>18}")
    for order in orders:
        for k in counts:
            pol = Policy(batch=SEQS_PER_MICRO * k, micro_batches=k, seq=2048, mb_order=order)
            ext, te = _timed(lambda: simulate_policy(model, pol, hw))
            full, tf = _timed(lambda: simulate_full(build_schedule(model, pol), hw))
            e, f = ext.summary, full.summary
            sim = ",".join(map(str, ext.extension.simulated)) if ext.extension else "all"
            err = [e.step_time_s / f.step_time_s - 1, e.device_peak_bytes / f.device_peak_bytes - 1,
                   e.host_bytes / f.host_bytes - 1, e.device_typical_peak_bytes / f.device_typical_peak_bytes - 1]
            peak = f"{err[3]:+.3%}" + (" (bound)" if ext.extension and not ext.extension.timeline_peak else "")
            print(f"{order:<6}{k:>14}{sim:>14}{te:>12.2f}{tf:>9.2f}{tf / te:>8.1f}x"
                  + "".join(f"{x:>+10.3%}" for x in err[:3]) + f"{peak:>18}", flush=True)


def cli(k: int, repeats: int = 3) -> float:
    argv = [sys.executable, "-m", "horizon_sim.cli.main", "plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
            "--ram", "512GiB", "--batch", str(SEQS_PER_MICRO * k), "--micro-batches", str(k)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    compare((32, 64, 124, 128) if quick else (32, 64, 124, 128, 256))
    print()
    for k in (128, 256):
        s = cli(k)
        print(f"horizon plan --batch {SEQS_PER_MICRO * k} --micro-batches {k} (whole process, advice included): "
              f"{s:.2f} s median of 3 (target < {TARGET_CLI_S:g} s) {'ok' if s < TARGET_CLI_S else 'MISSED'}")
