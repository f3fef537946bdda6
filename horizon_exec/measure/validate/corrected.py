"""The step-time errors with the drift probe's factors applied: a busy machine is measured, not
suffered.

`make demo` on a fresh clone, other work running beside it: the probe saw GEMMs at 1.35x their
calibrated speed and fixed costs at 1.24x, and validate still reported the errors against the
calibration as if the machine had been quiet. When a factor is off 1.00 by more than MOVED,
every configuration is simulated again on the hardware file scaled by the factors (GEMM and
attention rates by the GEMM factor, per-op fixed costs by the fixed-cost one) and both errors
are reported. The corrected one is the headline only when each factor's samples agree with each
other (spread within AGREE): a machine that changed speed mid-measurement gives no single
factor to correct with.
"""
import statistics
from dataclasses import replace

from horizon_sim.specs.hardware import HardwareSpec

MOVED = 0.05
"""A factor further than this from 1.00: the machine was not the calibrated one."""

AGREE = 0.10
"""Samples agree when (max - min) / median is within this."""

FACTORS = (("gemm_speed", "gemm_samples", "GEMMs"), ("fixed_cost_speed", "fixed_cost_samples", "per-op fixed costs"))


def machine_moved(drift: dict) -> bool:
    return any(drift.get(k) is not None and abs(drift[k] - 1.0) > MOVED for k, _, _ in FACTORS)


def samples_agree(drift: dict) -> bool:
    for _, samples, _ in FACTORS:
        xs = drift.get(samples) or []
        if len(xs) > 1 and (max(xs) - min(xs)) / statistics.median(xs) > AGREE:
            return False
    return True


def scaled_hardware(hw: HardwareSpec, gemm_speed: float | None, fixed_speed: float | None) -> HardwareSpec:
    """`hw` as fast as the probe saw the machine: a factor is predicted / measured time, so a
    rate is multiplied by it and a fixed cost divided by it (None: left as it is)."""
    d = hw.device
    if gemm_speed:
        rate = lambda rows, col: tuple((*r[:col], *(v * gemm_speed for v in r[col:])) for r in rows)  # noqa: E731
        d = replace(d, gemm_TFLOPs=rate(d.gemm_TFLOPs, 5), attention_TFLOPs=rate(d.attention_TFLOPs, 3),
                    masked_attention_TFLOPs=rate(d.masked_attention_TFLOPs, 3),
                    matmul_efficiency=min(1.0, d.matmul_efficiency * gemm_speed))
    if fixed_speed:
        d = replace(d, launch_overhead_us=d.launch_overhead_us / fixed_speed,
                    op_overhead_us=tuple((k, us / fixed_speed) for k, us in d.op_overhead_us))
    return replace(hw, device=d)


def factors_text(drift: dict) -> str:
    return ", ".join(f"{what} at {drift[k]:.2f}x" for k, _, what in FACTORS if drift.get(k) is not None)
