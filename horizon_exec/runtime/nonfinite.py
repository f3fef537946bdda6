"""The one rule for non-finite values in a step.

A NaN/inf loss or gradient must never reach the weights or the optimizer state. The loss and
the global gradient norm are known when the step's GRAD_NORM op runs; from then on the step's
optimizer ops update nothing (a skipped step is bit-exactly no step). In `backward` mode a
unit is updated before the global norm exists: its own squared norm and the loss (every HEAD
has run by then) are checked before its update, so a non-finite value stops the updates from
that unit on (the run then stops: the units already updated cannot be undone).
"""
import math


class NonFiniteGuard:
    def __init__(self, optimizer_mode: str):
        self.mode = optimizer_mode
        self.found: str | None = None
        """What was found not finite this step, '' / None when nothing."""
        self.updated_units = 0
        """Units this step's gradients were applied to."""

    def after_grad_norm(self, loss: float, total_sq: float) -> None:
        """The GRAD_NORM op: the loss and the global norm are known."""
        bad = [f"{w} {v}" for w, v in (("loss", loss), ("grad norm", math.sqrt(abs(total_sq))))
               if not math.isfinite(v)]
        if bad and self.found is None:
            self.found = " and ".join(bad)

    def may_update(self, unit_label: str, unit_sq, loss) -> bool:
        """Before an optimizer op applies this step's gradients to a unit: may it? unit_sq and
        loss are callables (read only when the mode needs them)."""
        if self.mode == "backward" and self.found is None:
            if not math.isfinite(sq := unit_sq()):
                self.found = f"gradient of unit {unit_label} (squared norm {sq})"
            elif not math.isfinite(l_ := loss()):
                self.found = f"loss {l_}"
        if self.found is not None:
            return False
        self.updated_units += 1
        return True

    def message(self, step: int, n_units: int) -> str:
        """Why a run with on_nonfinite='stop' stops at `step`."""
        msg = (f"step {step}: non-finite {self.found}; the update was not applied and the run stops "
               f"(on_nonfinite='stop')")
        if self.mode == "backward":
            return (msg + f"; optimizer='backward' had already applied this step's finite gradients to "
                    f"{self.updated_units} of {n_units} units before the non-finite one (no non-finite "
                    "value reached the weights or the optimizer state)")
        return msg + f"; weights and optimizer state are those after step {step - 1}"
