"""Learning-rate schedule: linear warmup, then cosine decay to a floor.

    lr(s) = peak * (s + 1) / warmup                                     s < warmup
    lr(s) = min_lr + (peak - min_lr) * (1 + cos(pi * p)) / 2,           s >= warmup
            p = (s - warmup) / max(1, total - warmup)

for optimizer steps s = 0 .. total-1 (0-based: the lr step s's gradients are applied with).
The first step already trains (peak / warmup), the first step after warmup uses the peak,
and the last step is just above min_lr. A pure function of s: nothing to save for resume
but its settings.
"""
import math
from dataclasses import dataclass

from horizon_sim.errors import HorizonError


@dataclass(kw_only=True, frozen=True, slots=True)
class CosineSchedule:
    peak: float
    """The lr after warmup."""
    total_steps: int
    """Steps of the run; the cosine reaches min_lr at s = total_steps."""
    warmup_steps: int = 0
    min_lr: float = 0.0
    """Floor of the decay."""

    def __post_init__(self):
        if not (self.peak > 0 and math.isfinite(self.peak)):
            raise HorizonError(f"lr {self.peak!r} must be a positive number")
        if not 0 <= self.min_lr <= self.peak:
            raise HorizonError(f"min lr {self.min_lr!r} must lie in [0, lr={self.peak}]")
        if self.total_steps <= 0:
            raise HorizonError(f"total steps {self.total_steps} must be positive")
        if self.warmup_steps < 0:
            raise HorizonError(f"warmup steps {self.warmup_steps} must be >= 0")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        p = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr + (self.peak - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))

    def to_dict(self) -> dict:
        return {"peak": self.peak, "total_steps": self.total_steps,
                "warmup_steps": self.warmup_steps, "min_lr": self.min_lr}
