"""DecoderBlock: the block of the spec's family, as the engine calls it."""
from collections.abc import Mapping

from horizon_exec.model.families import forward_of
from horizon_sim.specs.model import ModelSpec


class DecoderBlock:
    """y = block(w, x, cos, sin, window, docs) for x (B, T, H): the forward of the spec's family
    (horizon_exec/model/families). w maps transformers names relative to `model.layers.N.` to
    tensors (see layout.block_layout); cos, sin (T, hd) or (B, 1, T, hd) (positions per
    sequence); window: this block's sliding window (0 = none); docs (B, T) int: each token's
    document, or None (see attention_mask). router: a RouterStats (router_aux.py) an MoE
    block's router fills, or None. A family the executor does not run is refused by name."""

    def __init__(self, m: ModelSpec):
        self.m = m
        self.forward = forward_of(m)

    def __call__(self, w: Mapping, x, cos, sin, window: int = 0, docs=None, router=None):
        return self.forward(self.m, w, x, cos, sin, window, docs, router)
