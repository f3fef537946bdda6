"""Parameter layouts: where each named tensor of a unit lives inside its flat buffer.

A unit (the embedding, a decoder block, the head) is one contiguous flat vector on the host and
is streamed into a flat device slot; the layer template only ever sees named views of it.
A unit's host master (host_layout) names its tensors as the family's transformers class does
(specs/families: layer_prefix, embedding_name, final_norm_name, head_name), so weights copy 1:1
by name; the device side names them by role ("model.norm.<t>", "lm_head.weight" in the head;
block tensors relative to their layer), whatever the family.
"""
from dataclasses import dataclass
from math import prod

from horizon_sim.schedule.op import EMBED
from horizon_sim.specs import block
from horizon_sim.specs.families import family
from horizon_sim.specs.model import ModelSpec


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return prod(self.shape)


class Layout:
    """Named tensors packed back to back in one flat vector."""

    def __init__(self, named_shapes):
        entries, off = [], 0
        for name, shape in named_shapes:
            entries.append(Entry(name, tuple(shape), off))
            off += prod(shape)
        self.entries: tuple[Entry, ...] = tuple(entries)
        self.numel = off

    def views(self, flat, prefix: str = "") -> dict:
        """{prefix+name: view of `flat`} (no copies); `flat` may be longer than the layout."""
        return {prefix + e.name: flat[e.offset:e.offset + e.numel].view(e.shape) for e in self.entries}


def block_layout(m: ModelSpec) -> Layout:
    """One decoder block (m: a block's spec, ModelSpec.block_spec), names relative to
    `model.layers.N.` (transformers order; the tensors are the block description's,
    horizon_sim/specs/block.py)."""
    return Layout(block.parameters(m))


def final_norm_names(m: ModelSpec) -> tuple[str, ...]:
    """The device head's names of the final norm's tensors (a weight; LayerNorm's bias too)."""
    return tuple(f"model.norm.{t}" for t in block.norm_tensors(m))


def host_final_norm_names(m: ModelSpec) -> tuple[str, ...]:
    """The final norm's tensors by transformers' names (the host master's, checkpoints')."""
    return tuple(f"{family(m.family).final_norm_name}.{t}" for t in block.norm_tensors(m))


def head_device_layout(m: ModelSpec) -> Layout:
    """The head as the device sees it: final norm, then the LM head matrix (even when tied)."""
    return Layout([*((n, (m.hidden,)) for n in final_norm_names(m)), ("lm_head.weight", (m.vocab, m.hidden))])


def host_layout(m: ModelSpec, unit: int) -> Layout:
    """A unit's host master vector, with full transformers names. A tied head holds only the
    final norm: its matrix is the embedding's."""
    fam = family(m.family)
    if unit == EMBED:  # the token rows, then learned positions' (GPT-2)
        positions = [(fam.position_embedding_name, (m.max_position, m.hidden))] if fam.learned_positions else []
        return Layout([(fam.embedding_name, (m.vocab, m.hidden)), *positions])
    if unit == m.n_layers:
        s = [(n, (m.hidden,)) for n in host_final_norm_names(m)]
        return Layout(s if m.tied_embeddings else s + [(fam.head_name, (m.vocab, m.hidden))])
    blk = block_layout(m.block_spec(unit))
    return Layout([(f"{fam.layer_prefix}{unit}.{e.name}", e.shape) for e in blk.entries])


def unit_name(m: ModelSpec, unit: int) -> str:
    """A unit's display name ('emb', '0'..'L-1', 'head'): messages and checkpoint keys."""
    return {EMBED: "emb", m.n_layers: "head"}.get(unit, str(unit))

