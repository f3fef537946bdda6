"""How each published quantity is read from a planned step, and how its error is counted.

Throughput is published in several countings; each is recomputed from the planner's tokens/s
with the source's own counting, so the comparison is of speed, not of conventions:
  tflops_6NT   6 x params x tokens/s per GPU: forward + backward, no recompute (the usual MFU count)
  tflops_8NT   8 x params x tokens/s: with the forward recomputed in backward (full activation
               checkpointing), the count DeepSpeed's ZeRO-Offload/ZeRO-3 posts report (their
               Megatron-LM-v1.1.5-ZeRO3 prints it: megatron/utils.py flops_calculator)
Memory is read the way the source measured it: GB (1e9 bytes) or GiB (2^30: a script that
divides by 1024**3 and prints "GB"), the device peak, the host footprint, or the host RSS a
training loop samples between steps, after it has freed its gradients
(HostFootprint.between_steps_bytes).
"""
from dataclasses import dataclass
from typing import Callable

from horizon_sim.sim.simulate import SimResult
from horizon_sim.specs.model import ModelSpec
from horizon_sim.units import GiB


@dataclass(frozen=True)
class Quantity:
    name: str
    group: str
    """Which median it joins: 'throughput', 'host RAM', 'device memory' or 'fit'."""
    unit: str
    read: Callable[[SimResult, ModelSpec], float]


def _tflops(flops_per_param_token: int):
    return lambda r, m: flops_per_param_token * m.total_params * r.summary.tokens_per_s / 1e12


QUANTITIES: dict[str, Quantity] = {q.name: q for q in (
    Quantity("tokens_per_s", "throughput", "tokens/s", lambda r, m: r.summary.tokens_per_s),
    Quantity("step_s", "throughput", "s", lambda r, m: r.summary.step_time_s),
    Quantity("tflops_6NT", "throughput", "TFLOP/s", _tflops(6)),
    Quantity("tflops_8NT", "throughput", "TFLOP/s", _tflops(8)),
    Quantity("host_GB", "host RAM", "GB", lambda r, m: r.summary.host_bytes / 1e9),
    Quantity("host_GiB_between_steps", "host RAM", "GiB", lambda r, m: r.host.between_steps_bytes / GiB),
    Quantity("device_GB", "device memory", "GB", lambda r, m: r.summary.device_peak_bytes / 1e9),
    Quantity("device_GiB", "device memory", "GiB", lambda r, m: r.summary.device_peak_bytes / GiB),
    Quantity("fits", "fit", "1 = fits", lambda r, m: float(r.summary.fits)),
)}
GROUPS = ("throughput", "host RAM", "device memory", "fit")


def error(q: Quantity, predicted: float, published: float) -> float:
    """Relative error (predicted - published) / published; for a fit verdict 0 when right and
    1 when wrong. Step time is inverted first, so a slower prediction reads negative like a
    lower tokens/s."""
    if q.group == "fit":
        return float(predicted != published)
    if q.name == "step_s":
        return published / predicted - 1.0
    return predicted / published - 1.0
