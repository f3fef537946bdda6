"""RopeScaling: how a model stretches its rotary position embedding past the context it was
pretrained on, with transformers' names and defaults (modeling_rope_utils, transformers 5).

Kinds, as `rope_parameters["rope_type"]` (or `rope_scaling["type"]` in older configs) names them:
  linear   every inverse frequency divided by `factor` (position interpolation)
  dynamic  NTK-aware: the base grows with the sequence once it passes max_position_embeddings
  yarn     per-frequency blend of interpolation and extrapolation, cos/sin scaled by an
           attention factor
  llama3   Llama 3.1/3.2/3.3: low frequencies divided by `factor`, high ones kept, a smooth ramp
           between
  longrope Phi-3-mini-128k, Phi-3.5, Phi-4-mini: each frequency divided by its own factor, the
           short ones for sequences up to original_max_position, the long ones beyond; cos/sin
           scaled by an attention factor
The tables themselves are computed by the executor (horizon_exec/model/rope.py); the planner only
carries the description (scaling changes no parameter count and no FLOP).
"""
import math
from dataclasses import dataclass

from horizon_sim.errors import HorizonError

ROPE_KINDS = ("linear", "dynamic", "yarn", "llama3", "longrope")


@dataclass(kw_only=True, frozen=True, slots=True)
class RopeScaling:
    kind: str
    """One of ROPE_KINDS."""
    factor: float = 0.0
    """Context stretch; required by linear, dynamic, llama3. yarn, longrope: 0 =
    max_position_embeddings / original_max_position (what transformers does with factor null)."""
    original_max_position: int = 0
    """Pretraining context (llama3, yarn, longrope); 0 = max_position_embeddings, as transformers
    does."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max_position / low_freq_factor are divided by factor."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max_position / high_freq_factor are kept."""
    beta_fast: float = 32.0
    """yarn: rotations at which extrapolation starts (transformers' default 32)."""
    beta_slow: float = 1.0
    """yarn: rotations at which interpolation ends (transformers' default 1)."""
    attention_factor: float = 0.0
    """yarn, longrope: cos/sin multiplier; 0 = derived from factor (yarn: 0.1 ln(factor) + 1 or
    from mscale; longrope: sqrt(1 + ln(factor) / ln(original_max_position)))."""
    mscale: float = 0.0
    """yarn (DeepSeek style): with mscale_all_dim, the attention factor is their mscale ratio."""
    mscale_all_dim: float = 0.0
    truncate: bool = True
    """yarn: round the correction range to whole dimensions (transformers' default)."""
    short_factor: tuple = ()
    """longrope: one divisor per rotated frequency (rotary_dim / 2), for sequences up to
    original_max_position tokens."""
    long_factor: tuple = ()
    """longrope: the same for longer sequences."""

    def __post_init__(self):
        for f in ("short_factor", "long_factor"):  # JSON lists read back as the tuples written
            object.__setattr__(self, f, tuple(getattr(self, f)))
        if self.kind not in ROPE_KINDS:
            raise HorizonError(f"rope scaling type {self.kind!r} is not supported; allowed: "
                               f"{', '.join(ROPE_KINDS)}")
        for f in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                  "attention_factor", "mscale", "mscale_all_dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise HorizonError(f"rope scaling {f}={v!r} must be a finite number >= 0")
        derived = self.kind in ("yarn", "longrope")  # factor 0: from the two contexts
        if not derived and self.factor < 1.0:
            raise HorizonError(f"rope scaling {self.kind!r} factor={self.factor!r} must be >= 1")
        if derived and self.factor and self.factor < 1.0:
            raise HorizonError(f"rope scaling {self.kind!r} factor={self.factor!r} must be >= 1 (or null)")
        if (self.kind == "longrope") != bool(self.short_factor and self.long_factor):
            raise HorizonError(f"rope scaling {self.kind!r}: short_factor and long_factor are longrope's, and "
                               f"it needs both (got {len(self.short_factor)} and {len(self.long_factor)})")
        for f in ("short_factor", "long_factor"):
            for v in getattr(self, f):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    raise HorizonError(f"rope scaling {f} value {v!r} must be a finite number > 0")
        if not isinstance(self.original_max_position, int) or self.original_max_position < 0:
            raise HorizonError(f"rope scaling original_max_position={self.original_max_position!r} "
                               "must be an integer >= 0")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise HorizonError(f"rope scaling 'llama3' high_freq_factor={self.high_freq_factor} must "
                               f"exceed low_freq_factor={self.low_freq_factor}")
        if self.kind == "llama3" and self.low_freq_factor <= 0:
            raise HorizonError("rope scaling 'llama3' low_freq_factor must be > 0")
