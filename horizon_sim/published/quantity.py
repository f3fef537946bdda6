"""How each published quantity is read from a planned step, and how its error is counted.

Throughput is published in several countings; each is recomputed from the planner's tokens/s
with the source's own counting, so the comparison is of speed, not of conventions:
  tflops_6NT   6 x params x tokens/s per GPU: forward + backward, no recompute (the usual MFU count)
  tflops_8NT   8 x params x tokens/s: with the forward recomputed in backward (full activation
               checkpointing), the count DeepSpeed's ZeRO-Offload/ZeRO-3 posts report (their
               Megatron-LM-v1.1.5-ZeRO3 prints it: megatron/utils.py flops_calculator)
Memory is read the way the source measured it: GB (1e9 bytes) or GiB (2^30: a script that
divides by 1024**3 and prints "GB"), the device peak counted as the source counted it
(MEMORY_FIGURES: allocated, or nvidia-smi's used memory), the host footprint, or the host RSS a
training loop samples between steps, after it has freed its gradients
(HostFootprint.between_steps_bytes).
"""
from dataclasses import dataclass
from typing import Callable

from horizon_sim.errors import HorizonError
from horizon_sim.sim.simulate import SimResult
from horizon_sim.specs.model import ModelSpec
from horizon_sim.units import GiB


@dataclass(frozen=True)
class Quantity:
    name: str
    group: str
    """Which median it joins: 'throughput', 'host RAM', 'device memory' or 'fit'."""
    unit: str
    read: Callable[[SimResult, ModelSpec, str], float]
    """(the planned step, the model, the row's memory_figure) -> the figure in `unit`."""


MEMORY_FIGURES = {
    "allocated": "torch.cuda.max_memory_allocated: the tensors live at the peak, the math libraries' "
                 "workspaces among them (the caching allocator hands them out): the planner's device peak",
    "nvidia-smi": "the device's used memory (nvidia-smi, mem_get_info): the CUDA context and the allocator's "
                  "reserved segments beside the tensors: the planner's device peak plus the device's reserve "
                  "(DeviceSpec.reserved_GiB: context and allocator slack, an estimate), what its fit verdict counts",
    "reserved": "torch.cuda.max_memory_reserved: the allocator's segments, cached blocks included; the planner "
                "has no model of the allocator's rounding and caching yet, so it is not compared",
    "unknown": "the source does not say how the figure was read: not compared",
}
"""What a published device-memory figure counts, and what the planner reads for it."""


def device_bytes(r: SimResult, figure: str) -> float:
    """The planner's device memory, counted as a source's `figure` counts it (MEMORY_FIGURES)."""
    if figure == "allocated":
        return float(r.summary.device_peak_bytes)
    if figure == "nvidia-smi":
        return float(r.summary.device_peak_bytes) + r.hardware.device.reserved_GiB * GiB
    raise HorizonError(f"the {figure!r} device figure: {MEMORY_FIGURES.get(figure, 'not a known figure')}")


def _tflops(flops_per_param_token: int):
    return lambda r, m, f: flops_per_param_token * m.total_params * r.summary.tokens_per_s / 1e12


QUANTITIES: dict[str, Quantity] = {q.name: q for q in (
    Quantity("tokens_per_s", "throughput", "tokens/s", lambda r, m, f: r.summary.tokens_per_s),
    Quantity("step_s", "throughput", "s", lambda r, m, f: r.summary.step_time_s),
    Quantity("tflops_6NT", "throughput", "TFLOP/s", _tflops(6)),
    Quantity("tflops_8NT", "throughput", "TFLOP/s", _tflops(8)),
    Quantity("host_GB", "host RAM", "GB", lambda r, m, f: r.summary.host_bytes / 1e9),
    Quantity("host_GiB_between_steps", "host RAM", "GiB", lambda r, m, f: r.host.between_steps_bytes / GiB),
    Quantity("device_GB", "device memory", "GB", lambda r, m, f: device_bytes(r, f) / 1e9),
    Quantity("device_GiB", "device memory", "GiB", lambda r, m, f: device_bytes(r, f) / GiB),
    Quantity("fits", "fit", "1 = fits", lambda r, m, f: float(r.summary.fits)),
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
