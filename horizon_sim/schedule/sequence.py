"""The order of a step's compute ops and the weight slot each computes from.

Two orders (Policy.mb_order):
  micro  per micro-batch: the blocks' forwards, the head (forward and backward in one op), then
         the blocks in reverse by blocks of K: the block's inner boundaries recomputed from its
         checkpoint, then its layers' backwards in reverse
  layer  per block, every micro-batch's forward; every micro-batch's head; then per backward
         block (K layers, in reverse) every micro-batch's recompute and backwards: a unit's
         weights stay resident while all micro-batches pass it, so each crosses the link twice
         per step (forward, backward) when the slots hold a block, whatever the micro-batches
Kept layers (Policy.keep_last: the last `kept` of the forward) keep their forward's autograd
graph: their backward is one BACKWARD_SAVED each (no recompute, no checkpoint), run first in
the backward (they are the last layers), each for every micro-batch in the layer order; the
K-blocks then cover the layers before them.
Slots follow Belady's rule (evict the unit whose next use is furthest), never the slot the
previous compute op uses, so a load always overlaps compute; a unit still resident is not
loaded again, which saves link traffic when K > 1 or slots > 2, and is what makes the layer
order's consecutive uses of a unit free.
"""
from dataclasses import dataclass, replace

from horizon_sim.schedule.op import OpKind

_NEVER = float("inf")


@dataclass(frozen=True, slots=True)
class Use:
    """One compute op of the step, before emission."""
    kind: OpKind
    unit: int
    micro: int
    block_start: int | None = None
    """Set on the first compute op of a backward block: the block starts at this layer."""


def _backward_blocks(n_layers: int, act_ckpt_every: int) -> list[tuple[int, int]]:
    """The backward's blocks [start, end), last first."""
    return [(s, min(s + act_ckpt_every, n_layers)) for s in reversed(range(0, n_layers, act_ckpt_every))]


def _backward_block(start: int, end: int, m: int) -> list[Use]:
    """Micro-batch m through block [start, end): its inner boundaries recomputed, then its
    layers' backwards in reverse; the first op says where the block starts."""
    block = [Use(OpKind.RECOMPUTE, j, m) for j in range(start, end - 1)]
    block += [Use(OpKind.BACKWARD, j, m) for j in reversed(range(start, end))]
    return [replace(block[0], block_start=start)] + block[1:]


REFERENCE_KINDS = (OpKind.REF_FORWARD, OpKind.HEAD_LOSS)
"""The compute kinds of DPO's reference pass in a training step."""


def reference_sequence(n_layers: int, micro_batches: int, order: str = "micro") -> list[Use]:
    """DPO's reference pass before the step's own: every micro-batch's REF_FORWARDs through the
    blocks and its HEAD_LOSS, micro-batch by micro-batch, or block by block in the layer order."""
    micros = range(micro_batches)
    if order == "layer":
        return ([Use(OpKind.REF_FORWARD, layer, m) for layer in range(n_layers) for m in micros]
                + [Use(OpKind.HEAD_LOSS, n_layers, m) for m in micros])
    return [u for m in micros for u in [*(Use(OpKind.REF_FORWARD, layer, m) for layer in range(n_layers)),
                                        Use(OpKind.HEAD_LOSS, n_layers, m)]]


def compute_sequence(n_layers: int, act_ckpt_every: int, micro_batches: int, order: str = "micro",
                     kept: int = 0) -> list[Use]:
    """The step's compute ops in `order`, the last `kept` layers keeping their graph (module
    docstring)."""
    head, micros = n_layers, range(micro_batches)
    first_kept = n_layers - kept
    blocks = _backward_blocks(first_kept, act_ckpt_every)
    saved = range(n_layers - 1, first_kept - 1, -1)  # the kept layers' backwards, last first
    if order == "layer":
        out = [Use(OpKind.FORWARD, layer, m) for layer in range(n_layers) for m in micros]
        out += [Use(OpKind.HEAD, head, m) for m in micros]
        out += [Use(OpKind.BACKWARD_SAVED, layer, m) for layer in saved for m in micros]
        for start, end in blocks:
            for m in micros:
                out += _backward_block(start, end, m)
        return out
    out = []
    for m in micros:
        out += [Use(OpKind.FORWARD, layer, m) for layer in range(n_layers)]
        out.append(Use(OpKind.HEAD, head, m))
        out += [Use(OpKind.BACKWARD_SAVED, layer, m) for layer in saved]
        for start, end in blocks:
            out += _backward_block(start, end, m)
    return out


def assign_slots(seq: list[Use], n_slots: int, own_reference: bool = False) -> list[tuple[int, bool]]:
    """(slot, needs_load) per compute use (module docstring). own_reference: DPO's reference pass
    computes with weights of its own (full fine-tuning's reference copy), never the step's."""
    def key(use: Use):
        return ("ref", use.unit) if own_reference and use.kind in REFERENCE_KINDS else use.unit
    keys = [key(u) for u in seq]
    next_use = [_NEVER] * len(seq)
    seen: dict = {}
    for i in reversed(range(len(seq))):
        next_use[i] = seen.get(keys[i], _NEVER)
        seen[keys[i]] = i
    content: list[int | None] = [None] * n_slots
    content_next: list[float] = [_NEVER] * n_slots
    out, prev_slot = [], None
    for i, use in enumerate(seq):
        if keys[i] in content:
            s, load = content.index(keys[i]), False
        else:
            cands = [s for s in range(n_slots) if s != prev_slot]
            s = max(cands, key=lambda s: (content[s] is None, content_next[s], -s))
            load = True
        content[s], content_next[s] = keys[i], next_use[i]
        out.append((s, load))
        prev_slot = s
    return out
