"""CPU AdamW on one unit's flat buffers, through torch's fused CPU kernel.

The update is torch.optim.AdamW's (decoupled weight decay, bias correction) with the step
counter incremented before the kernel, as torch's own fused path does. Global-norm clipping
matches torch.nn.utils.clip_grad_norm_: coefficient min(1, max_norm / (norm + 1e-6)), passed
to the kernel as grad_scale = 1/coef (the kernel divides the gradient by it), so clipping
costs no extra pass over the gradient.
"""
from dataclasses import dataclass

import torch


@dataclass(kw_only=True, frozen=True, slots=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def step(self, param, grad, exp_avg, exp_avg_sq, step, clip_coef: float = 1.0, lr: float | None = None):
        """param, grad, exp_avg, exp_avg_sq: flat fp32 (n,) host tensors; step: fp32 scalar
        tensor (incremented here). The kernel updates param and both moments in place."""
        step += 1
        scale = None if clip_coef >= 1.0 else torch.tensor(1.0 / clip_coef, dtype=torch.float32)
        torch._fused_adamw_([param], [grad], [exp_avg], [exp_avg_sq], [], [step],
                            lr=self.lr if lr is None else lr, beta1=self.betas[0],
                            beta2=self.betas[1], weight_decay=self.weight_decay, eps=self.eps,
                            amsgrad=False, maximize=False, grad_scale=scale)


def clip_coef(grad_clip: float, total_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor (1.0 when clipping is off)."""
    if grad_clip <= 0:
        return 1.0
    return min(1.0, grad_clip / (total_norm + 1e-6))
