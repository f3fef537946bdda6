"""The whole validation's result: Validation holds every configuration's Outcome, the table of
their rows, the hardware and the machine's measured speed, and reduces them to the headline
figures and the JSON of errors that `horizon validate --json` prints.
"""
from dataclasses import dataclass, field

import pandas as pd

from horizon_exec.measure.validate.corrected import samples_agree
from horizon_sim.specs.hardware import HardwareSpec


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
        multi = t[t.ranks > 1] if "ranks" in t else t.iloc[:0]
        corrected = "step_s_err_corrected" in t
        median_corr = float(t.step_s_err_corrected.abs().median()) if corrected else None
        headline = "corrected" if corrected and samples_agree(self.drift) else "measured"
        return {
            "configs": len(t),
            "median_abs_step_err": float(step.median()),
            # the machine ran faster or slower than calibrated (corrected.py): the errors with the
            # probe's factors applied, the headline only when its samples agree with each other
            "machine_moved": corrected, "median_abs_step_err_corrected": median_corr,
            "headline": headline,
            "headline_median_abs_step_err": median_corr if headline == "corrected" else float(step.median()),
            "worst_step_err": float(worst.step_s_err), "worst_step_config": str(worst.config),
            "max_abs_device_peak_err": float(t.device_peak_MiB_err.abs().max()),
            "max_abs_rss_err": float(t.rss_MiB_err.abs().max()),
            "median_abs_busy_compute_err": float(t.busy_compute_s_err.abs().median()),
            "max_abs_overlap_err_pp": float(t.overlap_err.abs().max() * 100),
            "device_bound_held": bool(t.device_bound_held.all()),
            "device_bound_broken_by": [str(c) for c in t.config[~t.device_bound_held.astype(bool)]],
            "multi_rank_configs": len(multi),
            "median_abs_step_err_multi_rank": (float(multi.step_s_err.abs().median()) if len(multi)
                                               else None),
        }

    def errors_json(self) -> dict:
        cols = ["config", "ranks", "step_s_err", "device_peak_MiB_err", "device_bound_held", "rss_MiB_err", "overlap_err"]
        cols += [c for c in ("step_s_err_corrected",) if c in self.table]
        cols += [c for c in self.table.columns if c.startswith("busy_") and c.endswith("_err")]
        return {"figures": self.figures(), "hardware": self.hardware.name, "machine_speed": self.drift,
                "configs": [{k: (None if pd.isna(v) else v) for k, v in r.items()}
                            for r in self.table[cols].to_dict(orient="records")]}
