"""What a training process's resident memory (RSS) will be, term by term, for comparison with a
measured peak RSS. The planner's host footprint (memory.py) is what the job needs; RSS adds
what the process really holds in RAM on top:

  runtime           HostSpec.runtime_overhead_GiB: Python, torch, the lanes' threads and the
                    kernels' code and caches, before any model tensor (calibrate measures it)
  host store        the schedule's static host buffers (master, moments, working copy, ...)
  host dynamic      what the executor's pool of dynamic host buffers holds (checkpoints, staging,
                    grads: per size, the most live at once; memory.host_footprint)
  device arena      CPU backend only: the "device" is host RAM, so the device peak is RSS too
                    (the Schedule's static device buffers included: slots, RoPE tables, labels)
  allocator         CPU backend only: freed memory glibc's malloc keeps (see
                    allocator_retention_bytes); CUDA tensors live in the CUDA allocator, and
                    the host store is one allocation, so the term is negligible there
"""
from dataclasses import dataclass

from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import DTYPE_BYTES, Policy
from horizon_sim.units import GiB

MALLOC_THREADS = 5
"""Threads of a training process that allocate tensors, each with its own glibc arena: the
main thread and the four lane workers (h2d, compute, d2h, cpu)."""
MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc's cap on its adaptive mmap threshold on 64-bit Linux (DEFAULT_MMAP_THRESHOLD_MAX)."""


def largest_transient_block(model: ModelSpec, policy: Policy) -> int:
    """The largest single allocation a step frees to glibc (what its mmap threshold climbs
    to): a unit's device gradient (the head's when the vocabulary is large), one loss chunk's
    fp32 logits, a block's widest temporary, or a parameter tensor's random init. (Dynamic
    host buffers are not freed to glibc: the executor's pool keeps them.)"""
    a = DTYPE_BYTES[policy.compute_dtype]
    tok = policy.micro_batch * policy.seq
    c = min(policy.loss_chunk_tokens, tok)
    dgrad = max(model.max_layer_params, model.head_device_params) * a
    temps = max(c * model.vocab * 4, tok * model.ffn_hidden * a, tok * model.hidden * 4)
    init = max(model.ffn_hidden * model.hidden, model.vocab * model.hidden) * 4
    return int(max(dgrad, temps, init))


def allocator_retention_bytes(largest_block_bytes: int, threads: int = MALLOC_THREADS) -> int:
    """Freed memory glibc's malloc keeps in the process. A block at or above the mmap threshold
    is mmapped and unmapped when freed, but that raises the threshold to the block's size (up
    to 32 MiB) and the trim threshold to twice it; from then on each thread's arena keeps up
    to one trim threshold of freed memory instead of returning it to the OS. So about
    threads x 2 x min(largest freed block, 32 MiB)."""
    return int(threads * 2 * min(largest_block_bytes, MMAP_THRESHOLD_MAX))


@dataclass(frozen=True, slots=True)
class RssPrediction:
    terms: dict
    """Bytes per term (see the module docstring), in order."""

    @property
    def total_bytes(self) -> int:
        return int(sum(self.terms.values()))


def predict_rss(result, backend: str = "cpu") -> RssPrediction:
    """RSS peak of a process running `result`'s schedule (a SimResult) on `backend`. Data
    parallel: of the node's processes together (each its runtime, dynamic buffers, arena and
    allocator; the host store once, as memory.host_footprint counts it), which is what
    procfs.node_rss_bytes measures."""
    meta, hw = result.schedule.meta, result.hardware
    model, policy = meta.model, meta.policy
    by_role = dict(result.host.by_role)
    runtime = by_role.pop("runtime", int(hw.host.runtime_overhead_GiB * GiB))
    store = sum(b.bytes for b in result.schedule.buffers.values() if b.static and b.space.value == "host")
    terms = {"runtime": int(runtime), "host store": int(store),
             "host dynamic": int(sum(by_role.values()) - store)}
    if backend == "cpu":
        n = meta.layout.devices_per_node  # runtime and dynamic are the node's already (host_footprint)
        terms["device arena"] = n * int(result.summary.device_typical_peak_bytes)  # constants included
        terms["allocator"] = n * allocator_retention_bytes(largest_transient_block(model, policy))
    return RssPrediction(terms)
