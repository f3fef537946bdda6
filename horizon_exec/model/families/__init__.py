"""The families the executor runs: {ModelSpec.family: its block's forward}. A forward is
`forward(m, w, x, cos, sin, window, docs, router) -> y`, x and y (B, T, H), w the block's
tensors by the names its planner family lists (horizon_sim/specs/families); tests/test_families.py
holds every registered family to that description op by op and to transformers' gradients. A family the planner describes but that is not registered here is
refused by name before anything is allocated."""
from types import MappingProxyType

import torch

from horizon_exec.model.families import gemma2, llama, moe, olmo2, phi3, qwen3
from horizon_exec.model.layers import gemma_norm, rms_norm
from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import FAMILIES

FORWARDS = MappingProxyType({
    "llama": llama.forward, "qwen2": llama.forward, "mistral": llama.forward, "qwen3": qwen3.forward,
    "qwen3_moe": moe.qwen3_forward, "mixtral": moe.forward, "qwen2_moe": moe.forward,
    "phi3": phi3.forward, "olmo2": olmo2.forward, "gemma2": gemma2.forward, "gemma3_text": gemma2.gemma3_forward,
})

FINAL_NORMS = MappingProxyType({"olmo2": olmo2.norm, "gemma2": gemma_norm, "gemma3_text": gemma_norm})
"""The final norm (x, w, eps) -> normed rows of a family whose norm is not Llama's rms_norm."""

SCALED_EMBEDDINGS = frozenset({"gemma2", "gemma3_text"})
"""Families whose embedded rows are multiplied by sqrt(hidden) (in the rows' dtype, as
transformers rounds it) before the first block."""


def scale_embedded_(m, x):
    """x (..., H) embedded rows of m, scaled in place where m's family scales them; x."""
    if m.family in SCALED_EMBEDDINGS:
        x.mul_(torch.tensor(m.hidden ** 0.5, dtype=x.dtype))
    return x


def final_norm(m):
    """m's final norm, the head's (horizon_exec/model/head.py)."""
    return FINAL_NORMS.get(m.family, rms_norm)


def check_runnable(m) -> None:
    """A one-line error when the executor does not run m's family (train checks before allocating)."""
    if m.family not in FORWARDS:
        raise HorizonError(f"model {m.name!r}: family {m.family!r} ({FAMILIES[m.family].summary}) is planned "
                           f"only; the executor runs {', '.join(FORWARDS)}")
    if m.rotary_fraction != 1:
        raise HorizonError(f"model {m.name!r}: partial rotary embeddings (rotary_fraction={m.rotary_fraction}) are "
                           "planned only; the executor rotates every dimension of a head")


def forward_of(m):
    check_runnable(m)
    return FORWARDS[m.family]
