"""What DeepSpeed's per-tensor and per-module machinery counts in each unit of the peer's step:
the parameter tensors it copies one by one and the modules it hooks. Derived from the block's
own description (specs/block.py), so a model's counts follow its shape (biases, LayerNorm).

    tensors(model, unit), modules(model, unit), largest_tensor(model, unit)
"""
import math

from horizon_sim.schedule.op import EMBED
from horizon_sim.specs.block import NORMS, norm_tensors, parameters, projections
from horizon_sim.specs.model import ModelSpec

BLOCK_CONTAINERS = 4
"""Modules of a decoder layer that hold no parameter of their own but get DeepSpeed's hooks
(parameter_offload.py registers them on every submodule): the layer itself, its attention, its
MLP and the MLP's activation module (transformers' ACT2FN). An estimate from transformers'
Llama/Qwen2/GPT-2 block layout; a model's own modules may differ by one or two."""


def tensors(m: ModelSpec, unit: int) -> int:
    """Parameter tensors of `unit` (EMBED, a block 0..L-1, the head L): DeepSpeed on one GPU
    copies each with its own `.to(device)` (partition_parameters.py: _no_gather_coalesced,
    NoGatherHandle / NoGatherCoalescedHandle)."""
    if unit == EMBED:
        return 1
    if unit == m.n_layers:  # the final norm, and the LM head's matrix unless tied to the embedding
        return len(norm_tensors(m)) + (0 if m.tied_embeddings else 1)
    return len(parameters(m.block_spec(unit)))


def modules(m: ModelSpec, unit: int) -> int:
    """Modules of `unit` that run DeepSpeed's hooks: the projections, the norms and the
    containers of a block; the embedding; the final norm and the LM head."""
    if unit == EMBED:
        return 1
    if unit == m.n_layers:
        return 2
    return len(projections(m.block_spec(unit))) + len(NORMS) + BLOCK_CONTAINERS


def largest_tensor(m: ModelSpec, unit: int) -> int:
    """Elements of the largest parameter tensor of `unit` (its gradient is the largest one
    DeepSpeed works on alone: the device temporaries of partition_grads scale with it)."""
    if unit == EMBED:
        return m.vocab * m.hidden
    if unit == m.n_layers:  # a tied head's matrix is the embedding's (its gradient goes with it)
        return m.hidden if m.tied_embeddings else m.vocab * m.hidden
    return max(math.prod(shape) for _, shape in parameters(m.block_spec(unit)))
