"""When a run's steps come out far from its plan: was it the machine or the cost model?

A shared machine's speed moves by tens of percent within minutes, and a calibration taken in a
slow or a fast moment prices every later run at that moment's speed (`make demo`'s calibration
predicted the default tiny run 50% long; one taken minutes later, 2.9%). So when the compared
steps' median is more than RECHECK off the prediction, the run times `horizon validate`'s drift
references against the hardware file it was predicted on (measure/drift.py: the run's own
largest GEMM shapes in its compute dtype, and the tiny serialized model's per-op fixed costs),
and where the machine moved (validate/corrected.py's MOVED) predicts the run again on the file
scaled to the speed it found. The end of the run then says which it was: the machine (the
re-prediction is close: calibrate again) or the cost model (it is not: the report shows where).

Only where the prediction's speeds were measured on this machine (a hardware file, a cached
calibration): an estimate is already minutes old at most, and a comparison with a guess says
nothing. About two seconds (the probe builds the tiny model and times it twice), once, after the
last step.
"""
from dataclasses import dataclass
from types import SimpleNamespace

RECHECK = 0.10
"""A median step further than this from its prediction, (predicted - measured) / measured, is
checked against the machine's speed now."""
SAMPLES = 2
"""Probe samples: two, so a machine that changed speed during the probe shows as disagreeing
samples (validate/corrected.py samples_agree) rather than as one figure."""


@dataclass(frozen=True)
class Recheck:
    drift: dict
    """drift.Drift.summary(): the machine's speed now against the file's (predicted / measured time)."""
    prediction: object = None
    """plan_check.Prediction on the file scaled to that speed; None where the machine had not moved."""


def wanted(check, meas: dict) -> bool:
    """Is the median step of `meas` (PlanCheck.summary()) far enough off for a recheck?"""
    p, m = check.pred.step_s, meas["step_s"]
    return check.measured_speeds and check.repredict is not None and m > 0 and abs(p - m) / m > RECHECK


def recheck(check, tr, device: str) -> Recheck:
    """Time the drift references for `tr`'s model, policy and compute dtype on `device`, and
    re-predict on the scaled file where the machine moved (module docstring)."""
    from horizon_exec.measure.drift import DriftProbe
    from horizon_exec.measure.validate.corrected import machine_moved, scaled_hardware
    probe = DriftProbe(check.hardware, [SimpleNamespace(model=tr.model, policy=tr.policy)], device,
                       dtype=tr.policy.compute_dtype)
    try:
        for _ in range(SAMPLES):
            probe.sample()
    finally:
        probe.close()
    drift = probe.drift.summary()
    if not machine_moved(drift):
        return Recheck(drift)
    return Recheck(drift, check.repredict(scaled_hardware(check.hardware, drift.get("gemm_speed"),
                                                          drift.get("fixed_cost_speed"))))


def line(r: Recheck, measured_step_s: float) -> str:
    """The run's last word on its plan: the machine's speed now, and what it explains."""
    from horizon_exec.measure.validate.corrected import factors_text, samples_agree
    speed = factors_text(r.drift)
    if r.prediction is None:
        return (f"plan: this machine runs as fast as its file says ({speed}, drift probe after the run), so the "
                "step's error is the cost model's: the report shows it op by op")
    err = (r.prediction.step_s - measured_step_s) / measured_step_s
    moving = "" if samples_agree(r.drift) else "; its speed was still moving while probed, so this is rough"
    verdict = ("the machine moved since it was calibrated: `horizon calibrate` again for plans that hold"
               if abs(err) <= RECHECK else "the rest of the error is the cost model's: the report shows it op by op")
    return (f"plan: this machine now runs {speed} its file's speed (drift probe after the run){moving}; at that "
            f"speed the plan predicts {r.prediction.step_s * 1e3:.1f} ms a step (prediction error {err:+.1%}): "
            f"{verdict}")
