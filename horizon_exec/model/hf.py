"""transformers adapter: the reference model for a ModelSpec, and weight copies both ways.

Parameter names in the host store are transformers' own (see layout.py), so a copy is a
name-by-name load. transformers is imported only when these functions are called.
"""
import torch

from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.model import ModelSpec


def hf_model(spec: ModelSpec, dtype=torch.float32):
    """A randomly initialised LlamaForCausalLM / Qwen2ForCausalLM with spec's shapes (no
    download, eager construction on the CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    d = to_hf_config_dict(spec)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype)


@torch.no_grad()
def copy_to_hf(trainer, model) -> None:
    """trainer master weights -> model (a tied lm_head follows the embedding)."""
    params = dict(model.named_parameters())
    for name, t in trainer.state_dict().items():
        params[name].copy_(t)


def copy_from_hf(trainer, model) -> None:
    """model weights -> trainer master (and working copy)."""
    trainer.load_state_dict({n: p.detach() for n, p in model.named_parameters()})
