"""What DeepSpeed's stage-3 step does with the gradients beyond copying them, in the sizes the
peer's Schedule prices: the host passes of its optimizer step around DeepSpeedCPUAdam (bytes a
parameter), and the device temporaries partition_grads holds while a bucket goes to the host.

    ADAM_BYTES_PER_PARAM, UNSCALE_BYTES_PER_PARAM, cast_bytes_per_param(a)
    partition_grads_temporaries(model, zero3, units, last)
"""
from horizon_sim.peer.zero3_counts import largest_tensor
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule.op import DTYPE_BYTES_OF
from horizon_sim.specs.model import ModelSpec

ADAM_BYTES_PER_PARAM = 4 + 2 * 4 + 4 * 4
"""DeepSpeedCPUAdam per parameter: read the fp32 gradient, read and write the fp32 master and
both fp32 moments. It writes nothing else: stage 3 calls `self.optimizer.step()` on the fp32
partition alone (stage3.py _optimizer_step: v0.5.7 l.1640-1647, v0.7.0 l.838-844) and casts the
compute-dtype partition in a pass of its own after it (cast_bytes_per_param)."""

UNSCALE_BYTES_PER_PARAM = 4 + 4
"""unscale_and_clip_grads before the Adam: `fp32_partitioned_groups_flat[i].grad.mul_(1. /
combined_scale)`, a pass that reads and writes every fp32 gradient on the host, run whatever the
scale (1 in bf16; stage3.py v0.5.7 l.2885-2897, v0.7.0 l.1972-1981, 0.19.8 l.2979-2988)."""

NORM_PART_ELEMS = 250_000_000
"""_constant_buffered_norm2(input, buffer_size=250000000) takes a gradient's norm in parts of
this many elements, each converted to fp64 on the device first (`part.data.double()`: v0.7.0
l.1188-1195; 0.19.8 l.1960-1967, get_norm_dtype() is double on CUDA): a temporary of 8 bytes
an element, of the largest tensor up to this size."""


def cast_bytes_per_param(a: int) -> int:
    """_reassign_or_swap_out_partitioned_parameters after the Adam:
    `fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)`, a pass
    that reads the fp32 master and writes the partition the next step fetches, `a` bytes a
    parameter (stage3.py v0.5.7 l.2799-2802, v0.7.0 l.1856-1861, 0.19.8 l.2854-2859)."""
    return 4 + a


def partition_grads_temporaries(model: ModelSpec, zero3: Zero3Policy, units: list[int], last: bool) -> int:
    """Device bytes partition_grads holds while a bucket of `units` goes to the host (stage3.py
    __partition_grads, one gradient at a time, so the largest tensor's; `last`: the step's last
    micro-batch, the boundary): with fp32_grad_copy the gradient's device copy back from its host
    buffer (`grad_buffer.to(grad_partition.device)`, v0.7.0 l.1257, 0.19.8 l.2028: `a` bytes an
    element) and, at the boundary, the norm's fp64 part (NORM_PART_ELEMS) or the fp32 cast on
    its way down (`.float()` / `.to(dtype=fp32)`, 4 bytes; none when the host casts), whichever
    is larger (one is freed before the other). Not counted: v0.6-v0.7's flat copy of a bucket of
    several tensors (reduce_scatter_coalesced's `torch.cat`, runtime/comm/
    coalesced_collectives.py at v0.7.0 l.62-80), `a` bytes an element of the bucket while it
    goes down, which 0.19 avoids by reducing in the bucket itself."""
    a = DTYPE_BYTES_OF[zero3.compute_dtype]
    big = max(largest_tensor(model, u) for u in units)
    boundary = 0
    if last:
        norm = 8 * min(big, NORM_PART_ELEMS) if zero3.per_param_norm else 0
        cast = 0 if zero3.fp32_grad_copy and zero3.host_cast_at_boundary else 4 * big
        boundary = max(norm, cast)
    return (big * a if zero3.fp32_grad_copy else 0) + boundary
