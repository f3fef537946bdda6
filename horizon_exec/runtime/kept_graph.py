"""KeptGraph: a kept layer's forward with grad, held from its FORWARD to its BACKWARD_SAVED
(Policy.keep_last), so its backward runs from what autograd saved: no forward again.

The weights are views of a weight slot that is reloaded with other units between the forward
and the backward, and loads write the slot in place. So the graph does not keep the slot's
tensors: a saved-tensor hook packs a weight as its place in the slot (offset, shape, stride)
and unpacks it from the slot the unit is in when the backward runs, which the Schedule loads
with the same unit's weights. Everything else autograd saves (activations, the RoPE tables)
is kept as is. The output is handed over as the boundary buffer the next op reads. With the
router load-balancing loss on, the graph also keeps the MoE router's per-expert probability
sum, which the backward differentiates beside the output (model/router_aux.py). With adapters
(Policy.lora_rank) the base's weights are constants and the adapters the graph's leaves: the
backward gives their gradients, named '<module>.lora_A' and '<module>.lora_B'.
"""
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class _InSlot:
    """A saved weight, as its place in the slot (element offset from the slot's start)."""
    offset: int
    shape: tuple
    stride: tuple


class KeptGraph:
    def __init__(self, output, x, weights: dict, slot_ref: list, prob_sum=None):
        self.output, self._x, self._weights, self._slot_ref = output, x, weights, slot_ref
        self._prob_sum = prob_sum

    @classmethod
    def record(cls, block, w: dict, slot, x, attn_rows, router=None, lora: dict | None = None,
               lora_scale: float = 1.0, dropout=None) -> "KeptGraph":
        """Run `block` on x with grad, weights `w` (views of `slot`), keeping the graph;
        router: a RouterStats the block's router fills (its prob_sum stays in the graph);
        lora: the block's adapters {module: (A, B)} on a frozen base (scaled by lora_scale), and
        their dropout (model/adapters.AdapterDropout, or None)."""
        base, start = slot.untyped_storage().data_ptr(), slot.storage_offset()
        slot_ref = [None]  # the slot the backward reads the weights from (set by backward)

        def pack(t):
            if t.untyped_storage().data_ptr() == base:
                return _InSlot(t.storage_offset() - start, tuple(t.shape), tuple(t.stride()))
            return t

        def unpack(p):
            if isinstance(p, _InSlot):
                s = slot_ref[0]
                return s.as_strided(p.shape, p.stride, s.storage_offset() + p.offset)
            return p

        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            xg = x.detach().requires_grad_()
            if lora is None:
                wp = {k: v.detach().requires_grad_() for k, v in w.items()}
                y = block(wp, xg, *attn_rows, router=router)
            else:
                from horizon_exec.model.adapters import AdaptedWeights
                leaves = {k: (a.detach().requires_grad_(), b.detach().requires_grad_()) for k, (a, b) in lora.items()}
                wa = AdaptedWeights(w, leaves, lora_scale, dropout)
                y = block(wa, xg, *attn_rows, router=router)
                if wa.applied != set(leaves):
                    raise RuntimeError(f"the block's forward did not apply the adapters of "
                                       f"{', '.join(sorted(set(leaves) - wa.applied))}")
                wp = {f"{k}.lora_{n}": t for k, pair in leaves.items() for n, t in zip("AB", pair)}
        return cls(y, xg, wp, slot_ref, router.prob_sum if router is not None else None)

    def backward(self, dy, slot, prob_sum_grad=None) -> tuple[torch.Tensor, dict]:
        """(the input's grad, {weight name: its grad}) against the output's grad dy (and, with
        the router aux loss, the router's prob_sum against prob_sum_grad (E,)), the weights
        read from `slot`; the graph is released as it runs (it runs once)."""
        self._slot_ref[0] = slot
        names = list(self._weights)
        outs, gouts = [self.output], [dy]
        if prob_sum_grad is not None:
            outs.append(self._prob_sum)
            gouts.append(prob_sum_grad)
        grads = torch.autograd.grad(outs, [self._x, *self._weights.values()], gouts)
        self.output = self._x = self._weights = self._prob_sum = None
        return grads[0], dict(zip(names, grads[1:]))
