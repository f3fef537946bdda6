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
    in fp32 (a new tensor; the others are the store's views, or copies of a quantized base)."""
    sd = dict(trainer.state_dict())
    for u in trainer.adapters.blocks:
        sd.update(merged_unit(trainer, u, sd))
    return sd


@torch.no_grad()
def merged_unit(trainer, u: int, sd) -> dict:
    """Block u's adapted weights merged with their adapters, {transformers name: fp32 tensor
    (new)}, from `sd` (the base's tensors by name: at least block u's)."""
    ad, pre = trainer.adapters, _prefix(trainer.model)
    transposed = {p.module: p.transposed for p in ad.modules}
    out = {}
    for module, (a, b) in ad.weights(u).items():
        name = f"{pre}{u}.{module}.weight"
        delta = (b.float() @ a.float()).cpu() * ad.scale                    # (out, in)
        out[name] = sd[name].float() + (delta.t() if transposed[module] else delta)
    return out


def adapter_config(trainer, base_model: str | None) -> dict:
    """peft's LoraConfig for the run's adapters, as adapter_config.json holds it."""
    p, ad = trainer.policy, trainer.adapters
    names = sorted({q.module.rsplit(".", 1)[-1] for q in ad.modules})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model, "r": p.lora_rank,
            "lora_alpha": p.lora_alpha, "lora_dropout": p.lora_dropout, "target_modules": names, "bias": "none",
            "fan_in_fan_out": any(q.transposed for q in ad.modules), "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
            "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "README.md")
"""What a peft adapter folder holds (peft's save_pretrained writes a README.md beside the two)."""


def check_adapter_dir(out: Path, flag: str) -> None:
    """HorizonError unless `out` can be replaced by a saved adapter: absent, or a folder holding
    nothing but an adapter's files (it is replaced as a whole)."""
    from horizon_sim.errors import HorizonError
    if out.exists() and not out.is_dir():
        raise HorizonError(f"{flag} {str(out)!r} exists and is not a folder")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in ADAPTER_FILES)
        if other:
            raise HorizonError(f"{flag} {str(out)!r} holds files that are not part of a peft adapter (e.g. "
                               f"{other[0]!r}); save to a new or adapter-only folder")


def save_adapter(trainer, out, base_model: str | None = None) -> Path:
    """The run's adapters alone in peft's format at `out`, built aside and renamed into place."""
    from horizon_exec.checkpoints.fileio import publish_dir, staging_dir
    out = Path(out)
    check_adapter_dir(out, "--save-adapter")
    with staging_dir(out) as tmp:
        write_adapter(trainer, tmp, base_model)
        publish_dir(tmp, out)
    return out


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


def load_adapter(trainer, folder) -> None:
    """The run's adapters <- a peft LoRA adapter folder (adapter_config.json +
    adapter_model.safetensors, as write_adapter or peft's save_pretrained writes them); their
    moments and step start at zero (an initialisation). Its rank, alpha and targets must be the
    run's, and every adapted projection's A and B present with the run's shapes: otherwise a
    one-line HorizonError names what differs and the flag that sets it."""
    from safetensors import safe_open

    from horizon_sim.errors import HorizonError
    from horizon_sim.safe_read import read_json
    d, p, ad = Path(folder), trainer.policy, trainer.adapters
    if ad is None:
        raise HorizonError(f"--init-adapter {d}: the run has no adapters; give --lora-rank R (the adapter's r)")
    cfg_file, weights = d / "adapter_config.json", d / "adapter_model.safetensors"
    for f in (cfg_file, weights):
        if not f.is_file():
            raise HorizonError(f"--init-adapter {d}: no {f.name} there (a peft LoRA adapter folder holds "
                               "adapter_config.json and adapter_model.safetensors)")
    cfg = read_json(cfg_file)
    if not isinstance(cfg, dict):
        raise HorizonError(f"--init-adapter {d}: adapter_config.json is not a JSON object")
    names = sorted({q.module.rsplit(".", 1)[-1] for q in ad.modules})
    targets = cfg.get("target_modules")
    targets = sorted(targets) if isinstance(targets, list) else targets
    for key, have, want, flag in (("peft_type", cfg.get("peft_type"), "LORA", None),
                                  ("r", cfg.get("r"), p.lora_rank, "--lora-rank"),
                                  ("lora_alpha", cfg.get("lora_alpha"), p.lora_alpha, "--lora-alpha"),
                                  ("target_modules", targets, names, "--lora-targets"),
                                  ("use_dora", bool(cfg.get("use_dora")), False, None),
                                  ("use_rslora", bool(cfg.get("use_rslora")), False, None)):
        if have != want:
            how = f"; give {flag} {','.join(have) if isinstance(have, list) else have}" if flag and have else ""
            raise HorizonError(f"--init-adapter {d}: its {key} is {have!r}, the run's {want!r}{how}")
    pre = _prefix(trainer.model)
    want = {}
    for u in ad.blocks:
        for module, (a, b) in ad.weights(u).items():
            stem = f"base_model.model.{pre}{u}.{module}"
            want[f"{stem}.lora_A.weight"], want[f"{stem}.lora_B.weight"] = a, b
    seen = set()
    with safe_open(str(weights), framework="pt", device="cpu") as f:
        for key in f.keys():
            name = key.replace(".default.", ".")  # peft writes no adapter name; accept one
            if name not in want:
                raise HorizonError(f"--init-adapter {d}: tensor {key!r} is not an adapter of this run's model "
                                   f"and targets ({', '.join(names)})")
            t = f.get_tensor(key)
            if tuple(t.shape) != tuple(want[name].shape):
                raise HorizonError(f"--init-adapter {d}: {key} is {tuple(t.shape)}, the run's "
                                   f"{tuple(want[name].shape)}")
            if not torch.isfinite(t).all():
                raise HorizonError(f"--init-adapter {d}: {key} holds a non-finite value")
            with torch.no_grad():
                want[name].copy_(t.to(want[name].dtype))
            seen.add(name)
    missing = sorted(set(want) - seen)
    if missing:
        raise HorizonError(f"--init-adapter {d}: {len(missing)} adapter tensor(s) missing, e.g. {missing[0]!r}")
    with torch.no_grad():
        for u in ad.blocks:
            ad.state[u][1:].zero_()
            ad.grads[u].zero_()
        ad.step.zero_()
