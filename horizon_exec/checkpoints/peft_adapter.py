"""A LoRA run's outputs in the formats people load (Policy.lora_rank): the adapters alone as peft
writes them (adapter_config.json + adapter_model.safetensors, which
peft.PeftModel.from_pretrained loads onto the base), and the base with the adapters merged
(W + alpha / r * B A per adapted projection, as peft's merge_and_unload), which a plain
transformers folder holds. hf_checkpoint.save_hf writes both when the run has adapters."""
import json
from pathlib import Path

import torch

from horizon_exec.checkpoints.fileio import write_safetensors, write_text
from horizon_sim.schedule import work
from horizon_sim.specs.families import family
from horizon_sim.specs.policy import LORA_ALL

ADAPTER_DIR = "adapter"
"""The subfolder of a --save-hf folder that holds the adapters alone (peft's format)."""


def _prefix(model) -> str:
    return family(model.family).layer_prefix


def peft_stems(trainer, u: int) -> dict[str, str]:
    """{module: the key stem peft gives its adapter in block u} ('base_model.model.<layers>.u.<module>'):
    a routed-expert stack's adapter belongs to a ParamWrapper around the experts module, and
    peft nests one wrapper per adapted parameter in the module's parameter order, so an
    earlier stack's keys say 'base_layer.' once for each adapted stack after it."""
    stem, out = f"base_model.model.{_prefix(trainer.model)}{u}.", {}
    stacks = [p for p in trainer.adapters.modules_of[u] if p.experts]
    for p in trainer.adapters.modules_of[u]:
        if p.experts:
            parent = p.module.rsplit(".", 1)[0]
            later = sum(1 for q in stacks[stacks.index(p) + 1:] if q.module.rsplit(".", 1)[0] == parent)
            out[p.module] = stem + parent + ".base_layer" * later
        else:
            out[p.module] = stem + p.module
    return out


def to_peft(a, b):
    """An adapter pair as peft's lora_A and lora_B weights: a Linear's as they are; an expert
    stack's A (E, r, in) as one (E r, in) Linear, B (E, out, r) as one (out, r E) Linear whose
    column j E + e is expert e's column j (peft's ParamWrapper layout)."""
    if a.dim() == 2:
        return a, b
    E, out, r = b.shape
    return a.reshape(E * r, a.shape[-1]), b.permute(1, 2, 0).reshape(out, r * E)


def from_peft_(a, b, pa, pb) -> None:
    """a, b (the run's layout) <- peft's lora_A, lora_B weights pa, pb (to_peft's inverse)."""
    if a.dim() == 2:
        a.copy_(pa.to(a.dtype))
        b.copy_(pb.to(b.dtype))
        return
    E, out, r = b.shape
    a.copy_(pa.reshape(a.shape).to(a.dtype))
    b.copy_(pb.reshape(out, r, E).permute(2, 0, 1).to(b.dtype))


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
    out = {}
    for p in ad.modules_of[u]:
        a, b = ad.weights(u)[p.module]
        name = f"{pre}{u}.{p.tensor}"
        delta = (b.float() @ a.float()).cpu() * ad.scale                    # (out, in), per expert (E, out, in)
        out[name] = sd[name].float() + (delta.transpose(-1, -2) if p.transposed else delta)
    return out


def adapter_config(trainer, base_model: str | None) -> dict:
    """peft's LoraConfig for the run's adapters, as adapter_config.json holds it."""
    p, ad = trainer.policy, trainer.adapters
    names, stacks = target_names(trainer)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model, "r": p.lora_rank,
            "lora_alpha": p.lora_alpha, "lora_dropout": p.lora_dropout, "target_modules": names,
            "target_parameters": stacks or None, "bias": "none",
            "fan_in_fan_out": any(q.transposed and not q.experts for q in ad.modules), "use_rslora": False, "use_dora": False,
            "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
            "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}


def target_names(trainer) -> tuple[list[str], list[str]]:
    """(target_modules, target_parameters) as peft's LoraConfig names the run's adapters."""
    return names_of(trainer.model, adapted_pairs(trainer.model, trainer.policy))


def names_of(model, pairs: set[tuple[int, str]]) -> tuple[list[str], list[str]]:
    """(target_modules, target_parameters) that adapt the (layer, path) `pairs` of `model`, each
    sorted: a projection adapted in every block that has it by its target name (a Linear
    module's last name, an expert stack's parameter path), else each adapted layer's as
    '<layer>.<path in the block>' (peft's way for one layer's)."""
    mine = {(u, q.module): q for u in range(model.n_layers) for q in work.adaptable(model.block_spec(u))}
    out = ([], [])
    for name in sorted({work.target_name(mine[k]) for k in pairs}):
        have = {k for k, q in mine.items() if work.target_name(q) == name}
        adapted = have & pairs
        out[bool(mine[next(iter(adapted))].experts)].extend(
            [name] if adapted == have else sorted(f"{u}.{m}" for u, m in adapted))
    return sorted(out[0]), sorted(out[1])


def adapted_pairs(model, policy) -> set[tuple[int, str]]:
    """(layer, module or stack path) of every projection `policy`'s targets adapt in `model`."""
    return {(u, q.module) for u in range(model.n_layers)
            for q in work.adapted(model.block_spec(u), work.layer_policy(model, policy, u))}


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
    ad = trainer.adapters
    items = []
    for u in ad.blocks:
        stems = peft_stems(trainer, u)
        for module, pair in ad.weights(u).items():
            a, b = to_peft(*(t.detach().cpu() for t in pair))
            items += [(f"{stems[module]}.lora_A.weight", a.contiguous(), None),
                      (f"{stems[module]}.lora_B.weight", b.contiguous(), None)]
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "adapter_model.safetensors", items, {"format": "pt"})
    write_text(folder / "adapter_config.json", json.dumps(adapter_config(trainer, base_model), indent=2) + "\n")


def _adapted_by(trainer, cfg: dict, d) -> set[tuple[int, str]]:
    """The (layer, path) pairs an adapter folder's config adapts in the run's model, as peft
    matches its target_modules (a list of names, or 'all-linear'), target_parameters and
    layers_to_transform (which picks target_modules' layers); what peft would not match, or a
    name no block has, is a one-line error."""
    from dataclasses import replace

    from horizon_sim.errors import HorizonError
    tm, tp, layers = cfg.get("target_modules"), cfg.get("target_parameters") or [], cfg.get("layers_to_transform")
    for key, v in (("target_modules", tm if tm != LORA_ALL else []), ("target_parameters", tp)):
        if v is not None and not (isinstance(v, list) and all(isinstance(n, str) and n.strip() for n in v)):
            raise HorizonError(f"--init-adapter {d}: its {key} is {v!r}; want a list of names"
                               + (" or 'all-linear' (a regular expression is not taken)" if key == "target_modules" else ""))
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if layers is not None and not (isinstance(layers, list) and all(isinstance(u, int) and not isinstance(u, bool)
                                                                     for u in layers)):
        raise HorizonError(f"--init-adapter {d}: its layers_to_transform is {layers!r}; want layer indices")
    pattern = cfg.get("layers_pattern")
    names = pattern if isinstance(pattern, list) else [pattern] if pattern else []
    prefix = family(trainer.model.family).layer_prefix
    if layers and names and not set(names) & set(prefix.split(".")):
        raise HorizonError(f"--init-adapter {d}: its layers_pattern is {pattern!r}; this model's layers are "
                           f"{prefix}<layer> (layers_pattern {prefix.rstrip('.').rsplit('.', 1)[-1]!r} or none)")
    modules = [LORA_ALL] if tm == LORA_ALL else list(tm or [])
    try:
        pol = replace(trainer.policy, lora_targets=",".join(modules + tp), lora_dropout=0.0)
        work.check_adapter_targets(trainer.model, pol)
    except HorizonError as e:
        raise HorizonError(f"--init-adapter {d}: its targets: {e}") from None
    pairs = adapted_pairs(trainer.model, pol)
    if layers:  # (peft applies it to target_modules only)
        model = trainer.model
        stacks = {(u, q.module) for u in range(model.n_layers) for q in work.adaptable(model.block_spec(u)) if q.experts}
        pairs = {k for k in pairs if k[0] in layers or k in stacks}
    return pairs


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
    ours = adapted_pairs(trainer.model, p)
    names, stacks = names_of(trainer.model, ours)
    for key, have, want, how in (
            ("peft_type", cfg.get("peft_type"), "LORA", ""),
            ("r", cfg.get("r"), p.lora_rank, f"; give --lora-rank {cfg.get('r')}"),
            ("lora_alpha", cfg.get("lora_alpha"), p.lora_alpha, f"; give --lora-alpha {cfg.get('lora_alpha')}"),
            ("use_dora", bool(cfg.get("use_dora")), False, ""),
            ("use_rslora", bool(cfg.get("use_rslora")), False, "")):
        if have != want:
            raise HorizonError(f"--init-adapter {d}: its {key} is {have!r}, the run's {want!r}{how if have else ''}")
    theirs = _adapted_by(trainer, cfg, d)
    if theirs != ours:  # the same projections, however named (--lora-targets names both kinds)
        u, m = min(theirs ^ ours)
        raise HorizonError(f"--init-adapter {d}: it adapts {len(theirs)} projections, the run {len(ours)} (layer {u}'s "
                           f"{m} in {'it' if (u, m) in theirs else 'the run'} alone); give --lora-targets "
                           + ",".join(sum(names_of(trainer.model, theirs), [])))
    want, shapes = {}, {}  # key -> (its module's pair, "A" | "B"); key -> peft's shape
    for u in ad.blocks:
        stems = peft_stems(trainer, u)
        for module, pair in ad.weights(u).items():
            for side, t in zip("AB", to_peft(*pair)):
                key = f"{stems[module]}.lora_{side}.weight"
                want[key], shapes[key] = (pair, side), tuple(t.shape)
    got: dict[int, dict] = {}
    seen = set()
    with safe_open(str(weights), framework="pt", device="cpu") as f:
        for key in f.keys():
            name = key.replace(".default.", ".")  # peft writes no adapter name; accept one
            if name not in want:
                raise HorizonError(f"--init-adapter {d}: tensor {key!r} is not an adapter of this run's model "
                                   f"and targets ({', '.join(names + stacks)})")
            t = f.get_tensor(key)
            if tuple(t.shape) != shapes[name]:
                raise HorizonError(f"--init-adapter {d}: {key} is {tuple(t.shape)}, the run's {shapes[name]}")
            if not torch.isfinite(t).all():
                raise HorizonError(f"--init-adapter {d}: {key} holds a non-finite value")
            pair, side = want[name]
            got.setdefault(id(pair), {"pair": pair})[side] = t
            seen.add(name)
    missing = sorted(set(want) - seen)
    if missing:
        raise HorizonError(f"--init-adapter {d}: {len(missing)} adapter tensor(s) missing, e.g. {missing[0]!r}")
    with torch.no_grad():
        for g in got.values():
            from_peft_(*g["pair"], g["A"], g["B"])
        for u in ad.blocks:
            ad.state[u][1:].zero_()
            ad.grads[u].zero_()
        ad.step.zero_()
