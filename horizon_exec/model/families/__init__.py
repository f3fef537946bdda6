"""The families the executor runs: {ModelSpec.family: ExecFamily}, its block's forward (and
its final norm and embedding scale where they are not Llama's). A forward is
`forward(m, w, x, cos, sin, window, docs, router) -> y`, x and y (B, T, H), w the block's
tensors by the names its planner family lists (horizon_sim/specs/families); tests/test_families.py
holds every registered family to that description op by op and to transformers' gradients. A family the planner describes but that is not registered here is
refused by name before anything is allocated."""
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

import torch

from horizon_exec.model.families import deepseek, gemma2, gpt2, gpt_neox, gpt_oss, llama, moe, olmo2, phi3, qwen3
from horizon_exec.model.layers import gemma_norm, layer_norm, rms_norm
from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import FAMILIES


@dataclass(frozen=True, slots=True)
class ExecFamily:
    """What the executor runs for one family, beyond the description the planner holds."""
    forward: Callable
    final_norm: Callable = rms_norm
    """The head's norm (x, *its tensors, eps) -> normed rows (head.py): (x, w, eps), or with a
    bias (x, w, b, eps); its tensors are the family's norm_tensors."""
    scaled_embedding: bool = False
    """Embedded rows are multiplied by sqrt(hidden), in the rows' dtype as transformers rounds it
    (Gemma), before the first block."""


_GEMMA = dict(final_norm=gemma_norm, scaled_embedding=True)
RUNS = MappingProxyType({
    "llama": ExecFamily(llama.forward), "qwen2": ExecFamily(llama.forward), "mistral": ExecFamily(llama.forward),
    "qwen3": ExecFamily(qwen3.forward), "qwen3_moe": ExecFamily(moe.qwen3_forward),
    "mixtral": ExecFamily(moe.forward), "qwen2_moe": ExecFamily(moe.forward), "phi3": ExecFamily(phi3.forward),
    "olmo2": ExecFamily(olmo2.forward, final_norm=olmo2.norm),
    "gemma2": ExecFamily(gemma2.forward, **_GEMMA), "gemma3_text": ExecFamily(gemma2.gemma3_forward, **_GEMMA),
    "gpt_neox": ExecFamily(gpt_neox.forward, final_norm=layer_norm), "gpt2": ExecFamily(gpt2.forward, final_norm=layer_norm),
    "gpt_oss": ExecFamily(gpt_oss.forward, final_norm=gpt_oss.norm),
    "deepseek_v2": ExecFamily(deepseek.forward), "deepseek_v3": ExecFamily(deepseek.forward),
})
FORWARDS = MappingProxyType({name: f.forward for name, f in RUNS.items()})


def scale_embedded_(m, x):
    """x (..., H) embedded rows of m, scaled in place where m's family scales them; x."""
    if scales_embedding(m):
        x.mul_(torch.tensor(m.hidden ** 0.5, dtype=x.dtype))
    return x


def scales_embedding(m) -> bool:
    return m.family in RUNS and RUNS[m.family].scaled_embedding


def final_norm(m):
    """m's final norm, the head's (horizon_exec/model/head.py)."""
    return RUNS[m.family].final_norm if m.family in RUNS else rms_norm


def check_runnable(m) -> None:
    """A one-line error when the executor does not run m's family (train checks before allocating)."""
    if m.family not in FORWARDS:
        raise HorizonError(f"model {m.name!r}: family {m.family!r} ({FAMILIES[m.family].summary}) is planned "
                           f"only; the executor runs {', '.join(FORWARDS)}")
    if FAMILIES[m.family].learned_positions and not m.max_position:
        raise HorizonError(f"model {m.name!r}: {m.family} learns a position embedding of max_position rows "
                           "(n_positions); max_position=0 (not given) cannot be trained")


def forward_of(m):
    check_runnable(m)
    return FORWARDS[m.family]
