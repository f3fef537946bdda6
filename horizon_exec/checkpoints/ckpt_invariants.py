"""What a checkpoint's numbers must satisfy to be resumable, checked tensor by tensor as a load
reads them (ckpt._read_state): a checkpoint whose checksums match but whose values no run can
have written (hand-edited, or written by a broken build) is reported as damaged like any other,
and the loader falls back to the previous intact one.

- master weights and pending gradients: finite (a NaN master makes every loss NaN; a NaN
  gradient is never left pending: its step was skipped);
- Adam moments (m then v): finite, v >= 0 (a negative v makes sqrt(v) NaN: every update is
  skipped, silently, for the rest of the run);
- per-unit Adam step counters: whole numbers in [0, trainer steps_done] (a unit is updated at
  most once per step).
The gradient-norm scalars are not checked: a skipped step leaves a NaN there on purpose.
What each tensor holds comes from the trainer's declaration (runtime/state_items.py).
Values are scanned in slices of CHUNK elements, so the check allocates little whatever a
unit's size."""
import math

from horizon_sim.schedule.op import Holds

CHUNK = 1 << 24


def _first_bad(flat, bad) -> tuple[int, float] | None:
    """(index, value) of the first element of the 1-D `flat` where bad(slice) is True, or None."""
    for a in range(0, flat.numel(), CHUNK):
        s = flat[a:a + CHUNK]
        m = bad(s)
        if bool(m.any()):
            i = int(m.nonzero()[0])
            return a + i, float(s[i])
    return None


def value_problem(name: str, t, holds: Holds | None, steps_done: int) -> str:
    """What is wrong with the values of checkpoint tensor `name` ('' if nothing)."""
    import torch

    if name.startswith("steps."):
        c = float(t)
        if not (math.isfinite(c) and c == int(c) and 0 <= c <= steps_done):
            return f"an Adam step count of {c:g}, outside [0, {steps_done}] (the steps this trainer took)"
        return ""
    nonfinite = lambda s: ~torch.isfinite(s)  # noqa: E731
    if holds in (Holds.MASTER, Holds.HOST_GRAD, Holds.BASE_WEIGHTS):
        bad = _first_bad(t.reshape(-1), nonfinite)
        return f"a non-finite value {bad[1]} at element {bad[0]}" if bad else ""
    if holds == Holds.ADAPTERS:  # the adapters, then their m and v
        w, m, v = t.reshape(3, -1)
        bad = _first_bad(w, nonfinite)
        if bad:
            return f"a non-finite adapter weight {bad[1]} at element {bad[0]}"
    if holds in (Holds.MOMENTS, Holds.ADAPTERS):
        m, v = t.reshape(2, -1) if holds == Holds.MOMENTS else t.reshape(3, -1)[1:]
        bad = _first_bad(m, nonfinite)
        if bad:
            return f"a non-finite first moment {bad[1]} at element {bad[0]}"
        bad = _first_bad(v, lambda s: ~torch.isfinite(s) | (s < 0))
        return f"a second moment of {bad[1]} at element {bad[0]} (must be finite and >= 0)" if bad else ""
    return ""
