"""Every run checks itself against its plan (issue 39, item 3): the planner's prediction of this
run's own Schedule on this machine, made once at start, and the measured steps set against it.

    pred = predict(tr.sched, hw, source="hardware file hw.toml", backend="cpu")
    check = PlanCheck(pred)
    rec.update(check.observe(res))   # after warm-up: measured and predicted step time, device peak, RSS
    check.after_break()              # a checkpoint or eval ran: the next step is not compared

What is predicted is what `horizon validate` predicts (measure/validate/compare.py): the
simulation of the Schedule on the hardware file's real speeds (not the admission's machine,
whose memories are the budgets), its step time, its typical device peak, and the host RSS of
process_rss.predict_rss plus the training data this process holds (a training run holds its
packed tokens; validate's probe holds none). On the CPU backend the file is re-priced for the
compute threads this run uses (specs/core_split.split_hardware), as `--compute-threads auto`
prices its choice.

Which steps are compared, as validate drops its warm-up and starts each turn with one unmeasured
step: not the first WARMUP_STEPS of this process (the first runs without a pending update and
measures every op's temporaries; both touch their memory for the first time), nor a skipped
step, nor the step after a checkpoint or an eval (written files and another Schedule evict the
caches). Measured, as validate measures: the step's engine run (StepResult.step_s, the data
loading around it excluded), the device peak of that step, and the process's peak RSS so far.
"""
import math
import statistics
from collections import deque
from dataclasses import dataclass, field, replace

from horizon_sim.sim.process_rss import predict_rss
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.cpu_ranks import is_cpu_backend, laid_out
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.units import GiB, fmt_bytes

WARMUP_STEPS = 2
"""Steps of this process not compared (module docstring)."""
KEPT_TIMELINES = 32
"""Measured timelines kept for the overlay (the last ones compared; one is drawn): a long run
keeps a bounded sample, not every step's."""


@dataclass(frozen=True)
class Prediction:
    """The planner's figures for one step of this run on this machine."""
    step_s: float
    device_peak_bytes: int
    """The simulated typical step's device peak (the Schedule's static device buffers included)."""
    host_rss_bytes: int
    """predict_rss's total plus the training data (module docstring)."""
    tokens_per_s: float
    """The step's tokens (every rank's) over step_s."""
    source: str
    """Which hardware the speeds are from, for the start line and the report."""
    timeline: object = field(default=None, compare=False, repr=False)
    """The simulated step (horizon_sim.sim.timeline columns), for the overlay; None where the
    figures were extended from fewer micro-batches (horizon_sim/sim/extend.py): then no
    simulated timeline is of this run's Schedule."""
    simulated_micro_batches: tuple = ()
    """The micro-batch counts simulated where the figures were extended (else empty)."""
    rss_terms: dict = field(default_factory=dict, compare=False)
    """Bytes per term of host_rss_bytes."""

    def line(self) -> str:
        return (f"plan: step {self.step_s * 1e3:.1f} ms ({self.tokens_per_s:,.0f} tokens/s), device peak "
                f"{fmt_bytes(self.device_peak_bytes)}, host RSS {fmt_bytes(self.host_rss_bytes)} ({self.source})")


def priced_hardware(hw: HardwareSpec, sched, compute_threads: int | None) -> HardwareSpec:
    """`hw` as this run uses it: laid out for its ranks, and on the CPU backend priced for its
    compute threads when the file can price that count (else as calibrated)."""
    from horizon_exec.device.core_split import with_disk_for
    from horizon_sim.specs.core_split import split_hardware, thread_speeds
    if compute_threads and is_cpu_backend(hw) and sched.meta.layout.ranks == 1 and compute_threads in thread_speeds(hw):
        hw = split_hardware(hw, compute_threads)
    return with_disk_for(sched, laid_out(hw, sched.meta.layout))


def predict(sched, hw: HardwareSpec, *, source: str, backend: str = "cpu", compute_threads: int | None = None,
            data_bytes: int = 0, runtime_bytes: int | None = None) -> Prediction:
    """Simulate `sched` on `hw` (module docstring). backend: 'cpu' or 'cuda' (the RSS model's
    terms differ); data_bytes: the training data this process holds; runtime_bytes: the
    process's runtime (RSS before any model tensor) where `hw` did not measure one (0, as in
    measure/machine's quick estimates): the admission's figure for it."""
    if not hw.host.runtime_overhead_GiB and runtime_bytes:
        hw = replace(hw, host=replace(hw.host, runtime_overhead_GiB=runtime_bytes / GiB))
    sim = simulate(sched, priced_hardware(hw, sched, compute_threads))
    rss = predict_rss(sim, "cpu" if backend == "cpu" else "cuda")
    terms = dict(rss.terms)
    if data_bytes:
        terms["training data"] = int(data_bytes)
    step_s = float(sim.summary.step_time_s)
    tokens = sched.meta.policy.tokens * sched.meta.layout.ranks
    return Prediction(step_s=step_s, device_peak_bytes=int(sim.summary.device_typical_peak_bytes),
                      host_rss_bytes=int(sum(terms.values())), tokens_per_s=tokens / step_s if step_s > 0 else math.nan,
                      source=source, timeline=None if sim.extension else sim.timeline, rss_terms=terms,
                      simulated_micro_batches=sim.extension.simulated if sim.extension else ())


def dataset_bytes(ds) -> int:
    """Bytes of the tensors a loaded Dataset holds (the token stream, its targets and document
    starts, or a pair dataset's rows and labels; the train/eval index)."""
    st = getattr(ds.data, "stream", None)
    parts = ([st.ids, st.target, st.starts] if st is not None else [ds.data.tokens, ds.data.labels]) + [ds.train, ds.eval]
    return int(sum(t.numel() * t.element_size() for t in parts if t is not None))


@dataclass(frozen=True, slots=True)
class Measured:
    """One compared step."""
    step: int
    step_s: float
    device_peak_bytes: int
    rss_bytes: int


class PlanCheck:
    """The run's prediction and the steps compared with it (module docstring)."""

    def __init__(self, prediction: Prediction, measured_speeds: bool = True, hardware: HardwareSpec | None = None,
                 repredict=None):
        self.pred = prediction
        self.measured_speeds = measured_speeds
        """The prediction's speeds were measured on this machine (a hardware file, a calibration),
        not a quick estimate: the report then goes beside the checkpoints by default."""
        self.hardware = hardware
        """The machine description the prediction was made on (before the run's own pricing)."""
        self.repredict = repredict
        """HardwareSpec -> Prediction of this run on another description (train/speed_recheck.py
        re-predicts on the file scaled to the machine's speed now); None: not offered."""
        self.recheck = None
        """speed_recheck.Recheck, once made at the end of the run."""
        self.steps: list[Measured] = []
        self.timelines: deque = deque(maxlen=KEPT_TIMELINES)   # (step_s, timeline) of the last compared steps
        self.seen = 0
        self._cold = False

    def after_break(self) -> None:
        """A checkpoint or an eval ran after the last step: the next one starts cold."""
        self._cold = True

    def observe(self, step: int, res) -> dict:
        """The metrics-log keys of step `step` (its StepResult `res`): measured and predicted
        step time, device peak and RSS; {} for a step not compared."""
        self.seen += 1
        cold, self._cold = self._cold, False
        if cold or self.seen <= WARMUP_STEPS or res.skipped:
            return {}
        m = Measured(step, float(res.step_s), int(res.device_peak_bytes), int(res.rss_peak_bytes))
        self.steps.append(m)
        self.timelines.append((m.step_s, res.timeline))
        p = self.pred
        return {"step_s": m.step_s, "predicted_step_s": p.step_s, "device_peak_bytes": m.device_peak_bytes,
                "predicted_device_peak_bytes": p.device_peak_bytes, "rss_bytes": m.rss_bytes,
                "predicted_rss_bytes": p.host_rss_bytes}

    @staticmethod
    def versus(rec: dict) -> str:
        """The progress bar's 'vs plan' of a metrics-log record: how far above (+) or below (-)
        the prediction the step's time, device peak and RSS were, (measured - predicted) /
        predicted; '' for a step not compared."""
        if "predicted_step_s" not in rec:
            return ""

        def rel(key):
            p = rec[f"predicted_{key}"]
            return f"{rec[key] / p - 1:+.0%}" if p > 0 else "n/a"
        return f"step {rel('step_s')} dev {rel('device_peak_bytes')} RSS {rel('rss_bytes')}"

    def summary(self) -> dict | None:
        """Measured figures over the compared steps (None: no step was compared): the median
        step time and device peak (validate's typical step), the largest device peak and the
        process's peak RSS, and the timeline whose step time is the median of those kept."""
        if not self.steps:
            return None
        kept = sorted(self.timelines, key=lambda t: t[0])
        return {"steps": len(self.steps), "first_step": self.steps[0].step, "last_step": self.steps[-1].step,
                "step_s": statistics.median(m.step_s for m in self.steps),
                "device_peak_bytes": statistics.median(m.device_peak_bytes for m in self.steps),
                "device_peak_max_bytes": max(m.device_peak_bytes for m in self.steps),
                "rss_bytes": max(m.rss_bytes for m in self.steps),
                "timeline": kept[len(kept) // 2][1]}
