"""What a Trainer hands back: a training step's result, an eval's, the state a checkpoint
records beside the host store, and the error of a non-finite step under on_nonfinite='stop'."""
import resource
import sys
from dataclasses import dataclass

import pandas as pd

from horizon_sim.errors import HorizonError


class NonFiniteError(HorizonError):
    """A step's loss or gradients were not finite and the policy is to stop (on_nonfinite='stop')."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


@dataclass(frozen=True, slots=True)
class StepResult:
    loss: float
    """Mean next-token cross-entropy over every labelled token of the step (plus
    router_aux_loss_coef * aux_loss when the model trains with the router aux loss)."""
    grad_norm: float
    """Global gradient norm before clipping."""
    timeline: pd.DataFrame
    """One row per op that ran (horizon_sim.sim.timeline columns), seconds from step start,
    plus temp_peak_bytes: the measured peak of a compute op's device temporaries (CPU backend;
    the measured counterpart of Op.workspace_bytes), 0 for other ops."""
    device_peak_bytes: int
    """Device memory peak over the step: arena buffers + measured op temporaries (CPU), or the
    caching allocator's peak (CUDA)."""
    rss_peak_bytes: int
    """Process peak resident set size so far."""
    step_s: float
    tokens: int
    """Tokens the step ran (batch * seq)."""
    labelled_tokens: int = 0
    """Tokens with a target (label != -100): the loss's denominator."""
    skipped: bool = False
    """The loss or a gradient was not finite and the update was not applied (on_nonfinite='skip')."""
    nonfinite: str = ""
    """What was not finite (e.g. 'grad norm nan'), '' when the step was finite."""
    aux_loss: float | None = None
    """The router load-balancing loss (unweighted: the mean over the step's micro-batches and
    ranks of transformers' aux), when the model trains with it; None otherwise."""
    dpo: dict | None = None
    """DPO: the means over the step's pairs (every rank's) of TRL's reward metrics, beta (pi - ref):
    rewards_chosen, rewards_rejected, reward_margin and reward_accuracy; None otherwise."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s if self.step_s > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class EvalResult:
    loss_sum: float
    """Sum of the token losses over every labelled token (no update was made)."""
    labelled_tokens: int
    batches: int
    """Runs of the eval Schedule (policy.batch rows each; the last padded with ignored rows)."""
    timeline: pd.DataFrame
    """The first run's ops, in StepResult.timeline's format."""
    device_peak_bytes: int
    """Device memory peak over the eval (StepResult.device_peak_bytes' definition)."""

    @property
    def loss(self) -> float:
        return self.loss_sum / max(1, self.labelled_tokens)


@dataclass(frozen=True, slots=True)
class TrainerState:
    """What a checkpoint records of a Trainer beyond its host store (Trainer.checkpoint_state,
    Trainer.restore; checkpoints/ckpt.py writes it as trainer.json's "trainer")."""
    steps_done: int
    pending: bool
    """Pipelined: the last step's gradients are in the store, not applied yet."""
    pending_lr: float
    """The lr those pending gradients are applied with."""
    lr: float
    """The lr the next step's gradients are applied with."""
    skipped_steps: int = 0
    """Steps whose update was not applied (non-finite loss or gradients)."""


def rss_peak_bytes() -> int:
    """This process's peak resident set size (ru_maxrss: KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)
