"""The model families Horizon describes, by name (ModelSpec.family). Each is one module here
(family.py says what a family gives); adding one is a module and a line in _ALL. The executor's
own registry (horizon_exec/model/families) says which of them it runs."""
from types import MappingProxyType
from typing import Mapping

from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import (deepseek, gemma2, gemma3_text, gpt2, gpt_neox, gpt_oss, llama, mistral, mixtral,
                                       olmo2, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe)
from horizon_sim.specs.families.family import ModelFamily, MoeTraits

_ALL = (llama.FAMILY, qwen2.FAMILY, mistral.FAMILY, qwen3.FAMILY,
        qwen3_moe.FAMILY, mixtral.FAMILY, qwen2_moe.FAMILY, phi3.FAMILY, gpt2.FAMILY, gpt_neox.FAMILY, gemma2.FAMILY, olmo2.FAMILY,
        gemma3_text.FAMILY, gpt_oss.FAMILY, deepseek.FAMILY_V2, deepseek.FAMILY_V3)

FAMILIES: Mapping[str, ModelFamily] = MappingProxyType({f.name: f for f in _ALL})
"""{name: family}, in the order errors list them."""
MOE_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.is_moe)
HF_ROWS = MappingProxyType({f.hf.model_type: f.hf for f in _ALL if f.hf is not None})
"""{config.json model_type: its transformers row} (hf_config.py, hf_defaults.py, hf_export.py)."""

__all__ = ["FAMILIES", "HF_ROWS", "MOE_FAMILIES", "ModelFamily", "MoeTraits", "family"]


def family(name: str) -> ModelFamily:
    """The family registered as `name`; a one-line error naming the allowed ones otherwise."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise HorizonError(f"model family={name!r}; allowed: {', '.join(FAMILIES)}") from None
