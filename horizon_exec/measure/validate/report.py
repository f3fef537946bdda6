"""The validation's reports: the markdown (reports/validation.md, with the cost terms behind every
predicted figure and the known gaps), the CSV table and one predicted-vs-measured Gantt overlay
per configuration (write_reports), and the one-line texts the CLI prints (speed_text,
figures_text, dumps).
"""
import json
from pathlib import Path

import pandas as pd

from horizon_exec.measure.validate.corrected import factors_text
from horizon_exec.measure.validate.measure import PER_TURN
from horizon_exec.measure.validate.validation import Validation
from horizon_sim.errors import HorizonError
from horizon_sim.units import fmt_bytes

COST_TERMS = """\
What each predicted figure is made of (horizon_sim/sim/costs.py, process_rss.py; every rate is
measured by `horizon calibrate`, every amount of work is counted from the model and policy):

- **compute op** = fixed overhead of its kind (Python dispatch and memory tracking of each of
  its ~70 to ~230 kernels, measured on a tiny model with ops serialized; the head pays it again
  per loss chunk) + its GEMMs, each 2mnk / the measured throughput at that shape and layout
  (interpolated in log space between measured shapes) + attention FLOPs / the measured causal
  SDPA throughput (forward and gradient kernels apart) + the bytes its elementwise kernels move
  (norms with fp32 statistics, RoPE, SiLU, casts, residual adds, the loss) / the measured
  bandwidth of those kernels; all of it runs (1 + compute_contention) times slower while
  host-lane work streams (the compute core shares cache and DRAM bandwidth with those threads).
- **copy op** (h2d, d2h) = per-op latency (+ a measured extra latency when it starts while the
  compute lane is busy: its thread waits for the interpreter lock and the arena lock that the
  compute lane's kernel dispatch and memory tracking keep taking) + bytes / one copy thread's
  measured rate; an offload that writes a squared norm adds a reduction pass over the gradient
  at the measured reduction rate. On the CPU backend copies are CPU work: all host-lane work
  shares the host-lane core(s) by processor sharing (k busy flows on c cores each run at c/k of
  their speed), then the DRAM bus.
- **CPU-lane op** = per-op latency (+ the same busy-compute extra) + parameters / the measured
  AdamW op rate (optimizer), or bytes / one thread's measured rate (gradient accumulation,
  embedding gather/scatter).
- **device peak** = the schedule's device buffers live at each instant + the running op's
  temporaries (counted tensor by tensor for the template: autograd's saved tensors, fp32 norm
  intermediates, the head's fp32 chunk logits; schedule/work.py), charged from a quarter into
  the op (the temporaries build up; a gradient still being offloaded when the op starts is gone
  by its peak); the Schedule's static device buffers include the RoPE tables and labels. A CPU-driven link casts while it copies,
  so loads without a working copy stage nothing on the device.
- **host RSS** (CPU backend) = runtime overhead (a process with torch and the executor
  running a tiny model, less its tensors) + host store + what the pool of dynamic host
  buffers holds (per size, the most live at once) + the device peak (the CPU backend's device
  is host RAM; constants included) + glibc's retained free memory (5 allocating threads x 2 x
  the largest block a step frees, up to 32 MiB). With several ranks: every term but the host
  store once per rank, the store (one /dev/shm mapping) once; measured as each rank's peak RSS
  less its resident shared memory, summed, plus the largest rank's shared memory.
- **data parallel** (2 ranks on this machine): the calibrated file laid out for the ranks
  (horizon_sim/specs/cpu_ranks.py: each rank one core for its compute and its lanes, AdamW
  rate per rank as calibrated); a collective = its bytes over the ring at the measured gloo
  loopback rate, as host-thread work on the rank's core.

Known gaps (not modelled):

- The machine itself drifts: a shared VM's speed changes by 10-40% over seconds to minutes
  (see 'step spread'), so calibration and validation see somewhat different machines; the
  step-time errors carry that common-mode offset. The machine-speed line above measures it
  with references between turns; it cannot see drift within a turn.
- The runtime's own RSS (torch, its thread pools and arenas, the mapped pages of its libraries)
  moves between processes and over time here: calibrations of this machine measured 358 to
  453 MiB for it, which is most of the host RSS error.
- The compute core's slowdown next to host-lane work is measured with a thread copying without
  pause; lighter host work (the optimizer's arithmetic, short copies) may slow it less. It
  varies between calibrations here (measured +1% to +22%).
- First touch of per-step host buffers (page faults) and an occasionally late offload (the copy
  thread descheduled) make some steps' d2h lane slower than modelled; the typical step's device
  peak is compared, the largest is shown beside it.
"""


def speed_text(drift: dict) -> str:
    """One line: how fast the machine ran during the measurement against the hardware file."""
    def one(key, what):
        x = drift.get(key)
        if x is None:
            return f"{what}: not measured"
        samples = ", ".join(f"{v:.2f}" for v in drift[key.replace("speed", "samples")])
        return f"{what} at {x:.2f}x their calibrated speed (samples {samples})"
    return ("machine during validation: " + one("gemm_speed", "GEMMs") + "; "
            + one("fixed_cost_speed", "per-op fixed costs"))


def step_headline(f: dict, drift: dict) -> str:
    """'median |step-time error| X%', and when the machine was not quiet (corrected.py) the
    error with the probe's factors applied too, the headline first."""
    measured = f"median |step-time error| {f['median_abs_step_err']:.1%}"
    if not f.get("machine_moved"):
        return measured
    corr = (f"{f['median_abs_step_err_corrected']:.1%} with the drift probe's factors applied "
            f"({factors_text(drift)})")
    if f["headline"] == "corrected":
        return (f"median |step-time error| {corr}; {f['median_abs_step_err']:.1%} as measured "
                "(the machine was not quiet: it ran at another speed than calibrated)")
    return (f"{measured} as measured; the machine was not quiet and the probe's samples disagree with "
            f"each other, so its factors are not trusted: {corr}")


def _multi_rank_text(f: dict, t: pd.DataFrame) -> str:
    if not f["multi_rank_configs"]:
        return ""
    names = ", ".join(t.config[t.ranks > 1])
    return (f"Data-parallel configurations ({names}: ranks share this machine's cores, gloo over loopback, "
            f"the node store shared; step = the slowest rank's, RSS = the node's): median |step-time error| "
            f"{f['median_abs_step_err_multi_rank']:.1%}. ")


def _pct(x) -> str:
    return "" if pd.isna(x) else f"{x:+.1%}"


def markdown(v: Validation) -> str:
    t, f = v.table, v.figures()
    lines = ["# Predicted vs measured: `horizon validate`", "",
             f"Machine: {v.hardware.name or v.hardware.device.name}. Each configuration ran "
             f"{int(t.steps.iloc[0])} measured steps (after warm-up) in a process of its own, the "
             f"configurations interleaved {PER_TURN} steps at a time (each turn after one unmeasured step); "
             "measured figures are medians over those steps. Predictions simulate the same Schedule on the calibrated "
             "HardwareSpec. Errors are (predicted - measured) / measured; overlap errors are in "
             "percentage points.", "",
             f"**M{step_headline(f, v.drift)[1:]}**, worst {f['worst_step_err']:+.1%} "
             f"({f['worst_step_config']}); max |device peak error| {f['max_abs_device_peak_err']:.1%}; "
             f"max |host RSS error| {f['max_abs_rss_err']:.1%}; max |overlap error| "
             f"{f['max_abs_overlap_err_pp']:.1f} pp. "
             + _multi_rank_text(f, v.table)
             + ("No measured step exceeded the device bound." if f["device_bound_held"] else
                f"**A measured step exceeded the device bound in {', '.join(f['device_bound_broken_by'])}.**"),
             "",
             "**Machine speed against the hardware file** (horizon_exec/measure/drift.py: references timed before "
             "the first turn and after each, while the configurations waited; predicted / measured time, "
             "1.00 = the calibrated machine; one off by more than 5% puts the errors with the factors "
             "applied beside the measured ones, horizon_exec/measure/validate/corrected.py): "
             + speed_text(v.drift).split(": ", 1)[1] + ". A step-time error of the same sign and size as "
             "(speed - 1) is the machine having changed since calibration, not the cost model."
             + (" Step error with the factors applied, per configuration: "
                + ", ".join(f"{r['config']} {_pct(r['step_s_err_corrected'])}" for r in t.to_dict(orient="records"))
                + "." if f["machine_moved"] else ""), "",
             "| config | what | step meas (ms) | step pred (ms) | step err | compute busy err | h2d busy err | "
             "d2h busy err | cpu busy err | overlap meas / pred | device peak meas (MiB) | dev err | "
             "dev peak max (MiB) | dev bound (MiB) | RSS meas (MiB) | RSS err | step spread | page faults / step |",
             "|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in t.to_dict(orient="records"):
        lines.append(
            f"| {r['config']} | {r['what']} | {r['step_s_meas'] * 1e3:.1f} | {r['step_s_pred'] * 1e3:.1f} | "
            f"{_pct(r['step_s_err'])} | {_pct(r.get('busy_compute_s_err'))} | {_pct(r.get('busy_h2d_s_err'))} | "
            f"{_pct(r.get('busy_d2h_s_err'))} | {_pct(r.get('busy_cpu_s_err'))} | "
            f"{r['overlap_meas']:.0%} / {r['overlap_pred']:.0%} | {r['device_peak_MiB_meas']:.1f} | "
            f"{_pct(r['device_peak_MiB_err'])} | {r['device_peak_max_MiB']:.1f} | "
            f"{r['device_bound_MiB']:.1f}{'' if r['device_bound_held'] else ' (exceeded)'} | {r['rss_MiB_meas']:.0f} | "
            f"{_pct(r['rss_MiB_err'])} | "
            f"{r['step_spread']:.0%} | {r['minor_faults_per_step']:,.0f} |")
    lines += ["", "Step spread: (slowest - fastest) / median measured step, the run-to-run noise of this "
              "machine during the measurement. Device peak: the median over the steps with every op's "
              "temporaries measured (each turn's first, untimed step: the timed steps replay what an op's "
              "first run measured, RuntimeConfig.track_memory; the typical step); 'dev peak max' is the largest, which is higher when an offload happened to be late "
              "(the copy thread descheduled) and the next backward started with two gradients on the device; "
              "'dev bound' is the most the Schedule allows whatever the timing (horizon_sim/sim/device_bound.py), "
              "which no step may exceed and which admission and `fits` use. "
              "Page faults / step: the median over the measured steps of the process's minor faults (memory first touched in that step: "
              "4 KiB each; not modelled, each costs a few microseconds of the lane that takes it).", "", "## Host RSS terms (predicted)", "",
              "| config | " + " | ".join(v.outcomes[0].rss_terms) + " |",
              "|:---|" + "---:|" * len(v.outcomes[0].rss_terms)]
    for o in v.outcomes:
        lines.append(f"| {o.config.name} | " + " | ".join(fmt_bytes(b) for b in o.rss_terms.values()) + " |")
    lines += ["", "## Cost terms", "", COST_TERMS, "## Overlays", "",
              "Predicted bars (light, upper row) above measured bars (lower row) per lane, same colour per "
              "op kind; grey lines join each compute op's predicted and measured start.", ""]
    for o in v.outcomes:
        lines += [f"### {o.config.name}: {o.config.what}", "", f"![{o.config.name}](validation_{o.config.name}.png)", ""]
    return "\n".join(lines)


def write_reports(v: Validation, out: Path, plots: bool = True) -> list[Path]:
    if not out.is_dir():
        raise HorizonError(f"reports folder {str(out)!r} does not exist")
    files = [out / "validation.csv", out / "validation.md"]
    v.table.to_csv(files[0], index=False, float_format="%.6g")
    files[1].write_text(markdown(v) + "\n", encoding="utf-8")
    if plots:
        from horizon_sim.report.overlay import plot_overlay
        for o in v.outcomes:
            r = o.row
            path = out / f"validation_{o.config.name}.png"
            plot_overlay(o.predicted, o.measured, path,
                         title=f"{o.config.name}: {o.config.label}\nstep measured {r['step_s_meas'] * 1e3:.0f} ms, "
                               f"predicted {r['step_s_pred'] * 1e3:.0f} ms ({r['step_s_err']:+.1%})")
            files.append(path)
    return files


def figures_text(v: Validation) -> str:
    f = v.figures()
    return (f"{step_headline(f, v.drift)} over {f['configs']} configurations, "
            f"worst {f['worst_step_err']:+.1%} ({f['worst_step_config']}); device peak error <= "
            f"{f['max_abs_device_peak_err']:.1%}; host RSS error <= {f['max_abs_rss_err']:.1%}; "
            + (f"data parallel ({f['multi_rank_configs']} configurations) median |step-time error| "
               f"{f['median_abs_step_err_multi_rank']:.1%}; " if f["multi_rank_configs"] else "")
            + "device bound "
            + ("held by every step" if f["device_bound_held"] else
               f"EXCEEDED in {', '.join(f['device_bound_broken_by'])}")
            + (f"\n{speed_text(v.drift)}" if v.drift else ""))


def dumps(v: Validation) -> str:
    return json.dumps(v.errors_json())
