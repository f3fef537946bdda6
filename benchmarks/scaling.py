"""Benchmark: data-parallel scaling on this machine, measured and predicted side by side (issue 16).

The same per-rank step, one rank and two ranks (one node: gloo over loopback TCP, the node's
host store shared), runs alternated --rounds times; measured tokens/s are medians over each
run's steps, the slowest rank's step time. Scaling efficiency = tokens/s(2) / (2 x tokens/s(1)).
The planner simulates both Schedules on the calibrated HardwareSpec (--hardware, default:
`calibrate --quick` now, about a minute), laid out for two ranks of the CPU backend
(horizon_sim/specs/cpu_ranks.py: each rank one core for its compute and its lanes). Target: the predicted
efficiency within 10% of the measured one.

The model (width 256, 6 layers, batch 2 x 256 per rank) is validate's `base` configuration,
in fp32: on CPUs without AVX-512 torch's bf16 GEMMs run ~60x slower than fp32 (measured
here: 0.0013 against 0.078 TFLOP/s), which would make the benchmark about bf16 kernels, not
scaling. On this 2-core machine one rank has a core for its compute and one for its lanes,
while two ranks have one core each for both: the efficiency is about that, and says so.

Run: .venv/bin/python benchmarks/scaling.py [--hardware machine.toml] [--rounds 2] [--steps 5]
"""
import argparse
import statistics as st
import sys
import time
from dataclasses import replace

from horizon_exec.measure.calibrate import calibrate
from horizon_exec.measure.ranks import measure_ranks
from horizon_exec.measure.validate.configs import CONFIGS
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.cpu_ranks import cpu_ranks
from horizon_sim.specs.hardware_io import load_hardware
from horizon_sim.specs.layout import Layout

TARGET = 0.10


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default=None, help="a calibrated hardware file (default: calibrate --quick now)")
    ap.add_argument("--rounds", type=int, default=2, help="alternated runs of each (default 2)")
    ap.add_argument("--steps", type=int, default=5, help="measured steps per run, after 2 warm-up steps")
    a = ap.parse_args()
    base = CONFIGS[0]
    model = base.model
    pol = replace(base.policy, compute_dtype="fp32", grad_dtype="fp32", working_copy=False, split_master=False)
    t0 = time.perf_counter()
    hw = (load_hardware(a.hardware) if a.hardware else
          calibrate("cpu", quick=True, say=lambda s: print(s, file=sys.stderr)))
    if not a.hardware:
        print(f"calibrated in {time.perf_counter() - t0:.0f} s")
    meas = {1: [], 2: []}
    for r in range(a.rounds):
        for n in (1, 2):
            res = measure_ranks(model, pol, n, steps=a.steps)
            meas[n].append(st.median(res["step_s"]))
            print(f"round {r + 1}: {n} rank(s): median step {meas[n][-1] * 1e3:.1f} ms "
                  f"(steps {', '.join(f'{s * 1e3:.0f}' for s in res['step_s'])} ms)", file=sys.stderr)
    tok = {n: n * pol.tokens / st.median(meas[n]) for n in (1, 2)}
    pred = {n: simulate(build_schedule(model, pol, Layout(n)), cpu_ranks(hw, n)).summary for n in (1, 2)}
    ptok = {n: n * pol.tokens / pred[n].step_time_s for n in (1, 2)}
    eff_m, eff_p = tok[2] / (2 * tok[1]), ptok[2] / (2 * ptok[1])
    print(f"machine: {hw.name}")
    print(f"model {model.name} L{model.n_layers} H{model.hidden}, per rank batch {pol.batch} x {pol.seq}, fp32, "
          f"optimizer {pol.optimizer}; {a.rounds} alternated runs of {a.steps} steps")
    print(f"{'ranks':>5}{'step meas':>12}{'step pred':>12}{'tok/s meas':>12}{'tok/s pred':>12}{'err':>8}")
    for n in (1, 2):
        print(f"{n:>5}{st.median(meas[n]) * 1e3:10.1f}ms{pred[n].step_time_s * 1e3:10.1f}ms{tok[n]:12,.0f}"
              f"{ptok[n]:12,.0f}{(ptok[n] - tok[n]) / tok[n]:+8.1%}")
    err = (eff_p - eff_m) / eff_m
    print(f"scaling efficiency: measured {eff_m:.3f}, predicted {eff_p:.3f} ({err:+.1%}; target within "
          f"{TARGET:.0%}: {'met' if abs(err) <= TARGET else 'NOT met'})")
    print(f"2 ranks vs 1: {tok[2] / tok[1]:.2f}x tokens/s measured, {ptok[2] / ptok[1]:.2f}x predicted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
