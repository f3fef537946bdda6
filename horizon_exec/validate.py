"""`horizon validate`: run small configurations through the executor, simulate the same Schedule
on a calibrated HardwareSpec, and compare, configuration by configuration:

  step time         median measured step (perf_counter around one engine run) against the
                    simulated step (the last op's end)
  busy time         per lane, seconds the lane runs ops (sum of op durations)
  overlap           the fraction of the copy/CPU lanes' busy time that runs while the compute
                    lane is busy (interval union intersection); errors in percentage points
  device peak       arena buffers + measured op temporaries (the executor) against the
                    simulated peak plus the executor's device constants (RoPE, labels)
  host RSS          the process's peak resident set (VmHWM) against process_rss.predict_rss

Each configuration runs in a process of its own (probe.Session), so each RSS peak is its own;
the configurations are measured interleaved, a few steps of each in turn, so they all sample
the machine over the same stretch of time (a shared machine's speed drifts by tens of percent
over seconds); each turn starts with one unmeasured step. Warm-up steps are dropped and every
measured figure is the median over the rest.
Writes reports/validation.md, reports/validation.csv and one predicted-vs-measured Gantt
overlay per configuration, reports/validation_<name>.png.
"""
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from horizon_sim.errors import HorizonError
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.process_rss import device_constant_bytes, predict_rss
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import fmt_bytes

LANES = ("compute", "h2d", "d2h", "cpu")
MiB = 2**20


def _llama(name, L, H, heads, kv, F, V=256):
    return ModelSpec(name=name, n_layers=L, hidden=H, n_heads=heads, n_kv_heads=kv, ffn_hidden=F,
                     vocab=V, norm_eps=1e-5, rope_theta=1e4)


@dataclass(frozen=True)
class Config:
    name: str
    model: ModelSpec
    policy: Policy
    what: str = ""

    @property
    def label(self) -> str:
        m, p = self.model, self.policy
        return (f"L{m.n_layers} H{m.hidden} V{m.vocab}, batch {p.batch}x{p.seq}, K={p.ckpt_every}, "
                f"{p.slots} slots, ckpt {p.ckpt_on}, opt {p.optimizer}"
                + ("" if p.working_copy else ", no wc") + (f", {p.micro_batches} micro" if p.micro_batches > 1 else ""))


CONFIGS = (
    Config("base", _llama("v-base", 6, 256, 4, 2, 688),
           Policy(batch=2, seq=256), "the default policy at width 256"),
    Config("deep_k2", _llama("v-deep", 12, 256, 4, 2, 688),
           Policy(batch=2, seq=128, ckpt_every=2, slots=3, ckpt_on="device", optimizer="backward",
                  grad_clip=0.0), "depth 12, K=2, 3 slots, checkpoints on the device, optimizer in backward"),
    Config("wide_after", _llama("v-wide", 4, 512, 8, 4, 1376),
           Policy(batch=2, seq=256, optimizer="after"), "width 512, optimizer after backward"),
    Config("batch4_k3", _llama("v-b4", 6, 384, 6, 2, 1024),
           Policy(batch=4, seq=128, ckpt_every=3), "batch 4, K=3 with checkpoints on the host"),
    Config("vocab8k", _llama("v-vocab", 4, 384, 6, 2, 1024, V=8192),
           Policy(batch=2, seq=256, ckpt_every=2, slots=4, ckpt_on="device", loss_chunk_tokens=256),
           "8k vocabulary (a real LM head, 2 loss chunks), 4 slots, K=2 on the device"),
    Config("nowc_micro", _llama("v-micro", 8, 256, 4, 2, 688),
           Policy(batch=4, seq=128, micro_batches=2, working_copy=False, optimizer="after"),
           "2 micro-batches, no working copy (fp32 loads cast on the device), optimizer after"),
)
"""Six small configurations that vary depth, width, batch, K, slots, checkpoint placement,
optimizer overlap, vocabulary, micro-batches and the working copy; about a minute in all on
a 2-core CPU."""

QUICK_CONFIGS = (
    Config("tiny_a", _llama("v-tiny-a", 3, 128, 2, 1, 352), Policy(batch=1, seq=64), "tiny, default"),
    Config("tiny_b", _llama("v-tiny-b", 4, 128, 2, 1, 352, V=512),
           Policy(batch=2, seq=64, ckpt_every=2, slots=3, ckpt_on="device", optimizer="after"),
           "tiny, K=2, optimizer after"),
)


# ---- metrics of one timeline ---------------------------------------------------------------------
def _union(intervals) -> list[tuple[float, float]]:
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(iv) -> float:
    return sum(b - a for a, b in iv)


def _intersect(x, y) -> float:
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def timeline_metrics(tl: pd.DataFrame) -> dict:
    """busy_<lane> (s), overlap (fraction of the other lanes' busy time that overlaps compute),
    end_s (the last op's end)."""
    out = {"end_s": float(tl.end_s.max())}
    for lane in LANES:
        out[f"busy_{lane}"] = float(tl[tl.lane == lane].dur_s.sum())
    comp = _union(zip(tl[tl.lane == "compute"].start_s, tl[tl.lane == "compute"].end_s))
    other = _union(zip(tl[tl.lane != "compute"].start_s, tl[tl.lane != "compute"].end_s))
    out["overlap"] = _intersect(comp, other) / _length(other) if other else 0.0
    return out


# ---- one configuration ---------------------------------------------------------------------------
@dataclass
class Outcome:
    config: Config
    row: dict
    predicted: pd.DataFrame
    measured: pd.DataFrame
    rss_terms: dict = field(default_factory=dict)


PER_TURN = 2
"""Measured steps a configuration runs per turn, after one unmeasured step: a process that sat
idle while the others ran starts its first step with cold caches (and a CPU that has dropped
its clock), which a training run stepping back to back never sees."""


def measure(configs, *, steps: int = 6, warmup: int = 1, device: str = "cpu", say=None,
            between=None) -> list[dict]:
    """Run every configuration in its own process, interleaved: all children start and warm
    up together (not measured), then turn after turn each runs one unmeasured step and up to
    PER_TURN measured ones while the others wait, so all configurations sample the machine over
    the same stretch of time. `between()`, when given, runs before the first turn and after
    each, while every child waits (the drift references). Returns, per configuration, the
    probe's measurements (steps, store bytes, RSS peak...)."""
    from contextlib import ExitStack
    from horizon_exec.probe import Session
    results = [{"steps": []} for _ in configs]
    with ExitStack() as stack:
        sessions = [stack.enter_context(Session(c.model, c.policy, warmup=warmup, device=device))
                    for c in configs]
        for s in sessions:
            s.start()
        turns = -(-steps // PER_TURN)
        if say:
            say(f"validate: {len(configs)} configurations started and warmed up; measuring {steps} steps "
                f"each, in {turns} interleaved turns")
        if between:
            between()
        for t in range(turns):
            n = min(PER_TURN, steps - t * PER_TURN)
            for res, s in zip(results, sessions):
                s.step()  # back up to speed after waiting for the others
                res["steps"] += [s.step() for _ in range(n)]
            if between:
                between()
    for res, s in zip(results, sessions):
        res.update(s.final)
    return results


def compare(cfg: Config, hw: HardwareSpec, res: dict, device: str = "cpu") -> Outcome:
    """Simulate `cfg` on `hw` and set the prediction against the measurements `res`."""
    sched = build_schedule(cfg.model, cfg.policy)
    sim = simulate(sched, hw)
    pred = timeline_metrics(sim.timeline)
    pred["step_s"] = sim.summary.step_time_s
    per_step = []
    for s in res["steps"]:
        tl = pd.DataFrame(s["timeline"])
        m = timeline_metrics(tl)
        m["step_s"] = s["step_s"]
        per_step.append((m, tl))
    meas = {k: statistics.median(m[k] for m, _ in per_step) for k in per_step[0][0]}
    # the step whose time is the median stands for the measurement in the overlay
    rep = sorted(per_step, key=lambda mt: mt[0]["step_s"])[len(per_step) // 2][1]
    dev_pred = sim.summary.device_peak_bytes + device_constant_bytes(cfg.model, cfg.policy)
    peaks = [s["device_peak_bytes"] for s in res["steps"]]
    dev_meas = statistics.median(peaks)  # the typical step; the largest is reported beside it
    rss = predict_rss(sim, "cpu" if device == "cpu" else "cuda")
    rss_meas = res["rss_peak_bytes"]
    row = {"config": cfg.name, "what": cfg.label, "params_M": cfg.model.total_params / 1e6,
           "steps": len(per_step)}

    def pair(key, p, m, rel=True):
        row[f"{key}_pred"], row[f"{key}_meas"] = p, m
        row[f"{key}_err"] = (p - m) / m if rel else p - m

    pair("step_s", pred["step_s"], meas["step_s"])
    for lane in LANES:
        if meas[f"busy_{lane}"] > 0:
            pair(f"busy_{lane}_s", pred[f"busy_{lane}"], meas[f"busy_{lane}"])
    pair("overlap", pred["overlap"], meas["overlap"], rel=False)
    pair("device_peak_MiB", dev_pred / MiB, dev_meas / MiB)
    row["device_peak_max_MiB"] = max(peaks) / MiB
    pair("rss_MiB", rss.total_bytes / MiB, rss_meas / MiB)
    row["minor_faults_per_step"] = statistics.median(s.get("minor_faults", 0) for s in res["steps"])
    row["step_spread"] = (max(m["step_s"] for m, _ in per_step) - min(m["step_s"] for m, _ in per_step)) / meas["step_s"]
    return Outcome(cfg, row, sim.timeline, rep, rss.terms)


# ---- the whole validation ------------------------------------------------------------------------
@dataclass
class Validation:
    hardware: HardwareSpec
    outcomes: list
    table: pd.DataFrame
    elapsed_s: float
    files: list = field(default_factory=list)
    drift: dict = field(default_factory=dict)
    """drift.Drift.summary(): the machine's speed during the measurement against the file's."""

    def figures(self) -> dict:
        t = self.table
        step = t.step_s_err.abs()
        worst = t.loc[step.idxmax()]
        return {
            "configs": len(t),
            "median_abs_step_err": float(step.median()),
            "worst_step_err": float(worst.step_s_err), "worst_step_config": str(worst.config),
            "max_abs_device_peak_err": float(t.device_peak_MiB_err.abs().max()),
            "max_abs_rss_err": float(t.rss_MiB_err.abs().max()),
            "median_abs_busy_compute_err": float(t.busy_compute_s_err.abs().median()),
            "max_abs_overlap_err_pp": float(t.overlap_err.abs().max() * 100),
        }

    def errors_json(self) -> dict:
        cols = ["config", "step_s_err", "device_peak_MiB_err", "rss_MiB_err", "overlap_err"]
        cols += [c for c in self.table.columns if c.startswith("busy_") and c.endswith("_err")]
        return {"figures": self.figures(), "hardware": self.hardware.name, "machine_speed": self.drift,
                "configs": [{k: (None if pd.isna(v) else v) for k, v in r.items()}
                            for r in self.table[cols].to_dict(orient="records")]}


def validate(hw: HardwareSpec, configs=CONFIGS, *, steps: int = 6, warmup: int = 1, device: str = "cpu",
             out_dir="reports", plots: bool = True, say=print) -> Validation:
    """Run, simulate and compare every configuration; write the report files into `out_dir`
    (None: write nothing). `say`: progress lines (None: quiet)."""
    from horizon_exec.drift import DriftProbe
    t0 = time.perf_counter()
    outcomes = []
    ref = DriftProbe(hw, configs, device)
    try:
        results = measure(configs, steps=steps, warmup=warmup, device=device, say=say, between=ref.sample)
    finally:
        ref.close()
    drift = ref.drift.summary()
    if say:
        say(speed_text(drift))
    for cfg, res in zip(configs, results):
        o = compare(cfg, hw, res, device)
        outcomes.append(o)
        if say:
            r = o.row
            say(f"validate {cfg.name:<11} step {r['step_s_meas'] * 1e3:7.1f} ms measured, "
                f"{r['step_s_pred'] * 1e3:7.1f} predicted ({r['step_s_err']:+.1%}); device peak "
                f"{r['device_peak_MiB_err']:+.1%}, host RSS {r['rss_MiB_err']:+.1%}")
    table = pd.DataFrame([o.row for o in outcomes])
    v = Validation(hw, outcomes, table, time.perf_counter() - t0, drift=drift)
    if out_dir is not None:
        v.files = write_reports(v, Path(out_dir), plots=plots)
    return v


# ---- reports ---------------------------------------------------------------------------------------
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
  by its peak) + the executor's RoPE tables and labels. A CPU-driven link casts while it copies,
  so loads without a working copy stage nothing on the device.
- **host RSS** (CPU backend) = runtime overhead (a process with torch and the executor
  running a tiny model, less its tensors) + host store + dynamic host buffers + the device
  peak (the CPU backend's device is host RAM) + device constants + glibc's retained free
  memory (5 allocating threads x 2 x the largest block a step frees, up to 32 MiB).

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
             f"**Median |step-time error| {f['median_abs_step_err']:.1%}**, worst {f['worst_step_err']:+.1%} "
             f"({f['worst_step_config']}); max |device peak error| {f['max_abs_device_peak_err']:.1%}; "
             f"max |host RSS error| {f['max_abs_rss_err']:.1%}; max |overlap error| "
             f"{f['max_abs_overlap_err_pp']:.1f} pp.", "",
             "**Machine speed against the hardware file** (horizon_exec/drift.py: references timed before "
             "the first turn and after each, while the configurations waited; predicted / measured time, "
             "1.00 = the calibrated machine; nothing is corrected with them): "
             + speed_text(v.drift).split(": ", 1)[1] + ". A step-time error of the same sign and size as "
             "(speed - 1) is the machine having changed since calibration, not the cost model.", "",
             "| config | what | step meas (ms) | step pred (ms) | step err | compute busy err | h2d busy err | "
             "d2h busy err | cpu busy err | overlap meas / pred | device peak meas (MiB) | dev err | "
             "dev peak max (MiB) | RSS meas (MiB) | RSS err | step spread | page faults / step |",
             "|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in t.to_dict(orient="records"):
        lines.append(
            f"| {r['config']} | {r['what']} | {r['step_s_meas'] * 1e3:.1f} | {r['step_s_pred'] * 1e3:.1f} | "
            f"{_pct(r['step_s_err'])} | {_pct(r.get('busy_compute_s_err'))} | {_pct(r.get('busy_h2d_s_err'))} | "
            f"{_pct(r.get('busy_d2h_s_err'))} | {_pct(r.get('busy_cpu_s_err'))} | "
            f"{r['overlap_meas']:.0%} / {r['overlap_pred']:.0%} | {r['device_peak_MiB_meas']:.1f} | "
            f"{_pct(r['device_peak_MiB_err'])} | {r['device_peak_max_MiB']:.1f} | {r['rss_MiB_meas']:.0f} | "
            f"{_pct(r['rss_MiB_err'])} | "
            f"{r['step_spread']:.0%} | {r['minor_faults_per_step']:,.0f} |")
    lines += ["", "Step spread: (slowest - fastest) / median measured step, the run-to-run noise of this "
              "machine during the measurement. Device peak: the median over the measured steps (the typical "
              "step); 'dev peak max' is the largest, which is higher when an offload happened to be late "
              "(the copy thread descheduled) and the next backward started with two gradients on the device. "
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
    return (f"median |step-time error| {f['median_abs_step_err']:.1%} over {f['configs']} configurations, "
            f"worst {f['worst_step_err']:+.1%} ({f['worst_step_config']}); device peak error <= "
            f"{f['max_abs_device_peak_err']:.1%}; host RSS error <= {f['max_abs_rss_err']:.1%}"
            + (f"\n{speed_text(v.drift)}" if v.drift else ""))


def dumps(v: Validation) -> str:
    return json.dumps(v.errors_json())
