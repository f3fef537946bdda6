"""A LoRA run's outputs in the formats people load (Policy.lora_rank): the adapters alone as peft
writes them (adapter_config.json + adapter_model.safetensors, which
peft.PeftModel.from_pretrained loads onto the base), and the base with the adapters merged
(W + alpha / r * B A per adapted projection, as peft's merge_and_unload), which a plain
transformers folder holds. hf_checkpoint.save_hf writes both when the run has adapters."""
import json
from pathlib import Path

import torch

from horizon_exec.checkpoints.fileio import write_safetensors, write_text
from horizon_sim.specs.families import family

ADAPTER_DIR = "adapter"
"""The subfolder of a --save-hf folder that holds the adapters alone (peft's format)."""


def _prefix(model) -> str:
    return family(model.family).layer_prefix


def merged_state_dict(trainer) -> dict:
    """The base's weights by transformers name, each adapted projection's merged with its adapter
    in fp32 (a new tensor; the others are the store's views)."""
    sd = dict(trainer.state_dict())
    ad, pre = trainer.adapters, _prefix(trainer.model)
    transposed = {p.module: p.transposed for p in ad.modules}
    with torch.no_grad():
        for u in ad.blocks:
            for module, (a, b) in ad.weights(u).items():
                name = f"{pre}{u}.{module}.weight"
                delta = (b.float() @ a.float()).cpu() * ad.scale                    # (out, in)
                sd[name] = sd[name].float() + (delta.t() if transposed[module] else delta)
    return sd


def adapter_config(trainer, base_model: str | None) -> dict:
    """peft's LoraConfig for the run's adapters, as adapter_config.json holds it."""
    p, ad = trainer.policy, trainer.adapters
    names = sorted({q.module.rsplit(".", 1)[-1] for q in ad.modules})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model, "r": p.lora_rank,
            "lora_alpha": p.lora_alpha, "lora_dropout": 0.0, "target_modules": names, "bias": "none",
            "fan_in_fan_out": any(q.transposed for q in ad.modules), "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
            "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}


def write_adapter(trainer, folder: Path, base_model: str | None = None) -> None:
    """adapter_config.json and adapter_model.safetensors (fp32, peft's key names) into `folder`."""
    ad, pre = trainer.adapters, _prefix(trainer.model)
    items = []
    for u in ad.blocks:
        for module, (a, b) in ad.weights(u).items():
            stem = f"base_model.model.{pre}{u}.{module}"
            items += [(f"{stem}.lora_A.weight", a.detach().cpu().contiguous(), None),
                      (f"{stem}.lora_B.weight", b.detach().cpu().contiguous(), None)]
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "adapter_model.safetensors", items, {"format": "pt"})
    write_text(folder / "adapter_config.json", json.dumps(adapter_config(trainer, base_model), indent=2) + "\n")
