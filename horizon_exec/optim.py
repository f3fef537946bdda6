"""CPU AdamW on one unit's flat buffers, through torch's fused CPU kernel.

The update is torch.optim.AdamW's (decoupled weight decay, bias correction) with the step
counter incremented before the kernel, as torch's own fused path does. Global-norm clipping
matches torch.nn.utils.clip_grad_norm_: coefficient min(1, max_norm / (norm + 1e-6)), passed
to the kernel as grad_scale = 1/coef (the kernel divides the gradient by it), so clipping
costs no extra pass over the gradient.

The unit is processed in cache-sized chunks: a bf16 gradient chunk is widened into a small
fp32 scratch, updated by the kernel, and the bf16 working copy is refreshed from the master
chunk while it is still in cache. Whole-buffer widen and refresh passes would each stream the
unit through DRAM again (measured on one core: ~0.25x the bare kernel's rate; chunked: ~0.75x, the rest is
the casts themselves). With fp32 grads and no working copy the unit is one kernel call.
"""
from dataclasses import dataclass

import torch


@dataclass(kw_only=True, frozen=True, slots=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    chunk_params: int = 1 << 19
    """Parameters per kernel call when a chunk must be widened or copied out: 2 MiB per fp32
    tensor, in L2/L3 while the casts touch it (2^18..2^20 measured alike; 2^16 pays call
    overhead, 2^22 spills)."""

    def step(self, param, grad, exp_avg, exp_avg_sq, step, clip_coef: float = 1.0,
             lr: float | None = None, working_copy=None, scratch=None):
        """param, exp_avg, exp_avg_sq: flat fp32 (n,) host tensors, updated in place; grad:
        flat (n,) fp32 or narrower (widened chunk by chunk into `scratch`, fp32, >= one chunk);
        step: fp32 scalar tensor, incremented once here; working_copy: optional flat (n,)
        tensor refreshed from the updated master."""
        step += 1
        scale = None if clip_coef >= 1.0 else torch.tensor(1.0 / clip_coef, dtype=torch.float32)
        kw = dict(lr=self.lr if lr is None else lr, beta1=self.betas[0], beta2=self.betas[1],
                  weight_decay=self.weight_decay, eps=self.eps, amsgrad=False, maximize=False,
                  grad_scale=scale)
        widen = grad.dtype != param.dtype
        if widen and (scratch is None or scratch.numel() < min(self.chunk_params, grad.numel())):
            scratch = torch.empty(min(self.chunk_params, grad.numel()), dtype=param.dtype)
        n = param.numel()
        chunk = self.chunk_params if widen or working_copy is not None else n  # else: one call
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            g = scratch[:e - s].copy_(grad[s:e]) if widen else grad[s:e]
            torch._fused_adamw_([param[s:e]], [g], [exp_avg[s:e]], [exp_avg_sq[s:e]], [], [step], **kw)
            if working_copy is not None:
                working_copy[s:e].copy_(param[s:e])


def clip_coef(grad_clip: float, total_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor (1.0 when clipping is off)."""
    if grad_clip <= 0:
        return 1.0
    return min(1.0, grad_clip / (total_norm + 1e-6))
