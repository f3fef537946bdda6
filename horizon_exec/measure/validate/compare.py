"""One configuration's comparison: simulate its Schedule on the HardwareSpec and set the
prediction against its measurements (step time, busy time per lane, overlap, device peak, host
RSS), as one table row and an Outcome that keeps both timelines for the overlay.
"""
import statistics
from dataclasses import dataclass, field

import pandas as pd

from horizon_exec.measure.validate.configs import Config
from horizon_exec.measure.validate.metrics import LANES, timeline_metrics
from horizon_sim.schedule import build_schedule
from horizon_sim.sim.process_rss import predict_rss
from horizon_sim.sim.simulate import simulate
from horizon_sim.specs.cpu_ranks import laid_out
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.layout import Layout
from horizon_sim.units import MiB



@dataclass
class Outcome:
    config: Config
    row: dict
    predicted: pd.DataFrame
    measured: pd.DataFrame
    rss_terms: dict = field(default_factory=dict)


def compare(cfg: Config, hw: HardwareSpec, res: dict, device: str = "cpu") -> Outcome:
    """Simulate `cfg` on `hw` and set the prediction against the measurements `res`."""
    sched = build_schedule(cfg.model, cfg.policy, Layout(cfg.ranks))
    sim = simulate(sched, laid_out(hw, Layout(cfg.ranks)))  # the machine's cores shared by the ranks
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
    dev_pred = sim.summary.device_typical_peak_bytes  # the constants are static device buffers of the Schedule
    dev_bound = sim.summary.device_peak_bytes
    # measured with every op tracked (the turns' first steps, measure.py), where there are such
    # steps: the timed ones replay what their ops' first runs measured (RuntimeConfig.track_memory)
    peaks = [s["device_peak_bytes"] for s in res.get("tracked_steps") or res["steps"]]
    dev_meas = statistics.median(peaks)  # the typical step; the largest is reported beside it
    rss = predict_rss(sim, "cpu" if device == "cpu" else "cuda")
    rss_meas = res["rss_peak_bytes"]
    row = {"config": cfg.name, "what": cfg.label, "params_M": cfg.model.total_params / 1e6,
           "ranks": cfg.ranks, "steps": len(per_step)}

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
    # The bound whatever the timing (device_bound.py): no measured step may exceed it.
    row["device_bound_MiB"] = dev_bound / MiB
    row["device_bound_held"] = max(peaks) <= dev_bound
    pair("rss_MiB", rss.total_bytes / MiB, rss_meas / MiB)
    row["minor_faults_per_step"] = statistics.median(s.get("minor_faults", 0) for s in res["steps"])
    row["step_spread"] = (max(m["step_s"] for m, _ in per_step) - min(m["step_s"] for m, _ in per_step)) / meas["step_s"]
    return Outcome(cfg, row, sim.timeline, rep, rss.terms)
