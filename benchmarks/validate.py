"""Benchmark: how well the planner predicts the executor on this machine (issue 5).

Calibrates the machine (or reads --hardware), runs `horizon validate`'s seven configurations
through the executor, simulates the same schedules, and prints per configuration the
predicted and measured step time, device peak and host RSS with their errors, then the
figures the issue targets and the worst case:
  median |step-time error|      target <= 10% (then 5%)
  max |device peak error|       target <= 5%
  max |host RSS error|          target <= 10%
Writes the report files into --out (default: a temporary folder, so reports/ is left alone;
`horizon validate` writes reports/).

Run: .venv/bin/python benchmarks/validate.py [--hardware machine.toml] [--steps 6] [--out DIR]
"""
import argparse
import sys
import tempfile
import time

from horizon_exec.measure.calibrate import calibrate
from horizon_exec.measure.validate import CONFIGS, validate
from horizon_sim.specs.hardware_io import load_hardware, save_hardware

TARGETS = {"median_abs_step_err": 0.10, "max_abs_device_peak_err": 0.05, "max_abs_rss_err": 0.10}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default=None, help="a calibrated hardware file (default: calibrate now)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=None, help="report folder (default: a temporary one)")
    a = ap.parse_args()
    quiet = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    if a.hardware:
        hw = load_hardware(a.hardware)
    else:
        hw = calibrate("cpu", say=quiet)
        path = tempfile.mktemp(suffix=".toml")
        save_hardware(hw, path)
        print(f"calibrated in {time.perf_counter() - t0:.0f} s -> {path}")
    out = a.out or tempfile.mkdtemp(prefix="horizon-validate-")
    v = validate(hw, CONFIGS, steps=a.steps, out_dir=out, say=quiet)
    t = v.table
    print(f"machine: {hw.name}")
    print(f"{'config':<12}{'step meas':>11}{'step pred':>11}{'err':>8}{'spread':>8}{'dev err':>9}{'RSS err':>9}"
          f"{'overlap m/p':>13}")
    for r in t.to_dict(orient="records"):
        print(f"{r['config']:<12}{r['step_s_meas'] * 1e3:9.1f}ms{r['step_s_pred'] * 1e3:9.1f}ms"
              f"{r['step_s_err']:+8.1%}{r['step_spread']:8.0%}{r['device_peak_MiB_err']:+9.1%}{r['rss_MiB_err']:+9.1%}"
              f"{r['overlap_meas']:7.0%}/{r['overlap_pred']:.0%}")
    f = v.figures()
    print(f"median |step-time error|: {f['median_abs_step_err']:.1%} (target <= 10%, then 5%)")
    print(f"worst step-time error:    {f['worst_step_err']:+.1%} ({f['worst_step_config']})")
    print(f"max |device peak error|:  {f['max_abs_device_peak_err']:.1%} (target <= 5%)")
    print(f"max |host RSS error|:     {f['max_abs_rss_err']:.1%} (target <= 10%)")
    print(f"median |compute busy error|: {f['median_abs_busy_compute_err']:.1%}; "
          f"max |overlap error|: {f['max_abs_overlap_err_pp']:.1f} pp")
    from horizon_exec.measure.validate import speed_text
    print(speed_text(v.drift))
    met = all(f[k] <= v_ for k, v_ in TARGETS.items())
    print(f"targets {'met' if met else 'NOT met'}; reports in {out}; {time.perf_counter() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
