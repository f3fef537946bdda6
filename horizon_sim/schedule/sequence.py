"""The order of a step's compute ops and the weight slot each computes from.

Per micro-batch: the blocks' forwards, the head (forward and backward in one op), then the
blocks in reverse by blocks of K: the block's inner boundaries recomputed from its checkpoint,
then its layers' backwards in reverse. Slots follow Belady's rule (evict the unit whose next use
is furthest), never the slot the previous compute op uses, so a load always overlaps compute;
a unit still resident is not loaded again, which saves link traffic when K > 1 or slots > 2.
"""
from dataclasses import dataclass

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


def compute_sequence(n_layers: int, act_ckpt_every: int, micro_batches: int) -> list[Use]:
    out = []
    head = n_layers
    for m in range(micro_batches):
        out += [Use(OpKind.FORWARD, layer, m) for layer in range(n_layers)]
        out.append(Use(OpKind.HEAD, head, m))
        for start in reversed(range(0, n_layers, act_ckpt_every)):
            end = min(start + act_ckpt_every, n_layers)
            block = [Use(OpKind.RECOMPUTE, j, m) for j in range(start, end - 1)]
            block += [Use(OpKind.BACKWARD, j, m) for j in reversed(range(start, end))]
            out.append(Use(block[0].kind, block[0].unit, m, block_start=start))
            out += block[1:]
    return out


def assign_slots(seq: list[Use], n_slots: int) -> list[tuple[int, bool]]:
    """(slot, needs_load) per compute use (module docstring)."""
    next_use = [_NEVER] * len(seq)
    seen: dict[int, int] = {}
    for i in reversed(range(len(seq))):
        next_use[i] = seen.get(seq[i].unit, _NEVER)
        seen[seq[i].unit] = i
    content: list[int | None] = [None] * n_slots
    content_next: list[float] = [_NEVER] * n_slots
    out, prev_slot = [], None
    for i, use in enumerate(seq):
        if use.unit in content:
            s, load = content.index(use.unit), False
        else:
            cands = [s for s in range(n_slots) if s != prev_slot]
            s = max(cands, key=lambda s: (content[s] is None, content_next[s], -s))
            load = True
        content[s], content_next[s] = use.unit, next_use[i]
        out.append((s, load))
        prev_slot = s
    return out
