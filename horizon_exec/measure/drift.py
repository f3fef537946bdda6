"""How fast the machine runs now against how fast it ran when it was calibrated.

A shared machine's speed moves by tens of percent over minutes, so a validation an hour (or a
minute) after `horizon calibrate` may run on a faster or slower machine than the one in the
hardware file. Between its measurement turns, `horizon validate` times two references that
the hardware file predicts, in a thread set up like the compute lane:
  gemm    the measured shapes of the file's GEMM table nearest to the validation models' own
          largest GEMM shapes (operands cold in cache, as calibrate times them) against the
          table's rates there;
  fixed   the calibration's tiny model with its ops serialized (calibrate.overheads.TinyProbe)
          against the file's prediction of its compute ops, which is what calibration measured.
Each figure is predicted time / measured time: 1.00 is the calibrated machine, 0.90 a machine
running 10% slower. Validation reports them beside the errors, so a user can tell a cost-model
error from a machine that changed under the measurement, and when one is off by more than 5%
also the errors with the factors applied (validate/corrected.py).
"""
import statistics
from dataclasses import dataclass, field

import torch

from horizon_exec.dtypes import TORCH_DTYPE
from horizon_sim.schedule import Lane, build_schedule
from horizon_sim.sim.costs import CostModel, log2_distance2
from horizon_sim.specs.hardware import HardwareSpec

MAX_SHAPES = 8
"""GEMM shapes timed per sample: the validation models' largest (by FLOPs x count), enough
to average the per-shape noise, few enough that a sample takes well under a second here."""

MIN_CALL_S = 20e-6
"""A reference GEMM the file predicts faster than this is launch-bound on a GPU (a kernel takes
a few microseconds whatever its size), where the table's rate says nothing: on an H200 the
quick configurations' shapes (m <= 128) measured at "0.00x" their predicted speed. Such shapes
are left out; if none is left, the table's own largest bf16 shapes are the reference."""


@dataclass
class Drift:
    """Per sample (before the first turn, then after each): predicted / measured time."""
    gemm: list = field(default_factory=list)
    fixed: list = field(default_factory=list)

    def summary(self) -> dict:
        med = lambda xs: float(statistics.median(xs)) if xs else None  # noqa: E731
        return {"gemm_speed": med(self.gemm), "fixed_cost_speed": med(self.fixed),
                "gemm_samples": list(self.gemm), "fixed_cost_samples": list(self.fixed)}


def reference_gemms(configs, max_shapes: int = MAX_SHAPES) -> list[tuple[str, int, int, int]]:
    """The GEMM shapes (layout, m, n, k) that carry most of the configurations' FLOPs (each an
    object with .model and .policy)."""
    from horizon_exec.measure.calibrate.kernels import model_gemms
    weight: dict = {}
    for cfg in configs:
        for shape in model_gemms(cfg.model, cfg.policy):
            _, m, n, k = shape
            weight[shape] = weight.get(shape, 0) + m * n * k
    return sorted(weight, key=lambda s: (-weight[s], s))[:max_shapes]


def _predicted_s(costs, shape) -> float:
    lay, m, n, k = shape
    return 2.0 * m * n * k / (costs.gemm.rate(lay, (m, n, k)) * 1e12)


def measured_twin(table: list[tuple[str, int, int, int]], shape: tuple[str, int, int, int]):
    """The measured shape of `table` nearest to `shape` (same layout, log2 distance), or
    `shape` itself when no shape of its layout was measured. The probe times shapes the file
    measured, so its figure is the machine's drift alone: at a shape between measured ones the
    file's rate is an interpolation, whose own error the probe would report as the machine
    having changed."""
    same = [t for t in table if t[0] == shape[0]]
    if not same:
        return shape
    return min(same, key=lambda t: (log2_distance2(t[1:], shape[1:]), t))


def drift_gemms(hw: HardwareSpec, costs, configs) -> list[tuple[str, int, int, int]]:
    """The GEMM references: the measured twins (measured_twin) of the configurations' largest
    shapes that are not launch-bound (MIN_CALL_S), else the file's own largest shapes, in the
    costs' dtype; none without a GEMM table of it."""
    if not costs.gemm:
        return []
    table = [(r[1], int(r[2]), int(r[3]), int(r[4])) for r in hw.device.gemm_TFLOPs if r[0] == costs.dtype]
    twins = list(dict.fromkeys(measured_twin(table, s) for s in reference_gemms(configs)))
    shapes = [s for s in twins if _predicted_s(costs, s) >= MIN_CALL_S]
    if not shapes:
        shapes = sorted(table, key=lambda s: (-s[1] * s[2] * s[3], s))[:MAX_SHAPES // 2]
    return shapes


class DriftProbe:
    """Times the references; `sample()` appends one figure of each to `drift`. `dtype`: the
    GEMMs' ('bf16', or 'fp32' for a run that computes in it: a CPU without bf16 instructions)."""

    def __init__(self, hw: HardwareSpec, configs, device: str = "cpu", dtype: str = "bf16"):
        from horizon_exec.measure.calibrate.overheads import TINY, TINY_POLICY, TinyProbe
        from horizon_exec.measure.probe import sync_for
        self.device, self.sync = device, sync_for(device)
        self.dtype = dtype
        costs = CostModel(hw, dtype)
        self.shapes = drift_gemms(hw, costs, configs)
        self.gemm_pred_s = sum(_predicted_s(costs, s) for s in self.shapes)
        sched = build_schedule(TINY, TINY_POLICY)
        tiny_costs = CostModel(hw, TINY_POLICY.compute_dtype, sched.meta)
        self.tiny_ops = {op.id: tiny_costs.compute_s(op) for op in sched.ops if op.lane == Lane.COMPUTE}
        self.backend = None
        if device == "cpu":
            from horizon_exec.device.cpu import CpuBackend
            self.backend = CpuBackend()
        self.tiny = TinyProbe(device)
        self.drift = Drift()

    def _in_compute_lane(self, fn):
        if self.backend is None:
            return fn()
        from horizon_exec.measure.calibrate.timing import in_lane
        return in_lane(self.backend, Lane.COMPUTE, fn)

    def _gemm_times(self) -> dict:
        """Seconds per call of each reference GEMM, timed as calibrate timed the rates they are
        compared with (on a GPU: CUDA events around back-to-back calls, calibrate/cuda.py)."""
        if self.device == "cpu":
            from horizon_exec.measure.calibrate.kernels import gemm_times
            return self._in_compute_lane(lambda: gemm_times(self.shapes, TORCH_DTYPE[self.dtype], self.device, self.sync))
        from horizon_exec.measure.calibrate.cuda import gemm_table
        with torch.cuda.device(self.device):
            rates = gemm_table(self.shapes, TORCH_DTYPE[self.dtype], self.device)
        return {s: 2.0 * s[1] * s[2] * s[3] / (r * 1e12) for s, r in rates.items()}

    def sample(self) -> None:
        if self.shapes:
            self.drift.gemm.append(self.gemm_pred_s / sum(self._gemm_times().values()))
        self.tiny.own.clear()
        self.tiny.sample(2)
        measured = sum(statistics.mean(self.tiny.own[i]) for i in self.tiny_ops)
        self.drift.fixed.append(sum(self.tiny_ops.values()) / measured)

    def close(self) -> None:
        self.tiny.close()
