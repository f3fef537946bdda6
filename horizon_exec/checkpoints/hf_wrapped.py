"""A checkpoint whose language model sits inside a multimodal model (Gemma 3's
Gemma3ForConditionalGeneration, model_type gemma3: hf_config.WRAPPED_TYPES). Horizon trains the
language model, read from its text_config; every other tensor (the vision tower, the projector)
is carried unchanged, in its own dtype, from the folder the run started from into --save-hf, with
that folder's config.json.

transformers (4.x and 5.x alike) stores the language model's tensors under `language_model.model.`
and an untied head as `language_model.lm_head.weight`; a folder written with the module paths of
transformers 5 (`model.language_model.`, `lm_head.weight`) is read too, and saved as it came. In
the trainer the tensors carry the language model's own names (`model.`, `lm_head.weight`)."""
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from horizon_sim.errors import HorizonError
from horizon_sim.safe_read import read_json
from horizon_sim.specs.hf_config import WRAPPED_TYPES

_SPELLINGS = (("language_model.model.", "language_model.lm_head.weight"), ("model.language_model.", "lm_head.weight"))
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


@dataclass(frozen=True)
class Carried:
    """A tensor of the folder that is not the language model's: where it is and what it is."""
    name: str
    file: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def meta(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    def read(self, folder: Path) -> torch.Tensor:
        from safetensors import safe_open
        with safe_open(str(folder / self.file), framework="pt", device="cpu") as f:
            return f.get_tensor(self.name)


@dataclass(frozen=True)
class Wrapped:
    folder: Path
    model_type: str
    prefix: str
    """The stored prefix of the language model's `model.` tensors."""
    head: str
    """The stored name of an untied LM head."""
    carried: tuple[Carried, ...]
    """Every other tensor, in the folder's order."""

    def held(self, stored: str) -> str | None:
        """The trainer's name of a stored tensor; None for a carried one."""
        if stored.startswith(self.prefix):
            return "model." + stored[len(self.prefix):]
        return "lm_head.weight" if stored == self.head else None

    def stored(self, held: str) -> str:
        """The name a tensor of the trainer is saved under."""
        return self.head if held == "lm_head.weight" else self.prefix + held.removeprefix("model.")

    def is_carried(self, name: str) -> bool:
        return name in self._by_name

    def saved_name(self, name: str) -> str:
        """A trainer's tensor's stored name; a carried one's own."""
        return name if self.is_carried(name) else self.stored(name)

    def saved_dtype(self, name: str, dtype: torch.dtype) -> torch.dtype:
        """A carried tensor keeps its dtype; the trainer's are saved in `dtype`."""
        return self._by_name[name].dtype if self.is_carried(name) else dtype

    def items(self) -> list:
        """(name, meta tensor) of every carried tensor: what a save plans its shards with."""
        return [(c.name, c.meta()) for c in self.carried]

    def read(self, name: str) -> torch.Tensor:
        return self._by_name[name].read(self.folder)

    @cached_property  # asked once per tensor of a save
    def _by_name(self) -> dict:
        return {c.name: c for c in self.carried}

    @property
    def carried_params(self) -> int:
        return sum(torch.Size(c.shape).numel() for c in self.carried)

    def check_readable(self) -> None:
        """Every carried tensor's file is still there (a save reads them at its end)."""
        for f in sorted({c.file for c in self.carried}):
            if not (self.folder / f).is_file():
                raise HorizonError(f"{self.folder / f}: the {self.model_type} checkpoint's file is gone; --save-hf "
                                   "carries its vision tower from it")


def wrapped(folder) -> Wrapped | None:
    """The folder's wrapping, or None for a checkpoint of a language model alone."""
    from safetensors import safe_open

    from horizon_exec.checkpoints.hf_checkpoint import weight_files
    d = Path(folder)
    cfg = read_json(d / "config.json")
    mt = cfg.get("model_type") if isinstance(cfg, dict) else None
    if mt not in WRAPPED_TYPES:
        return None
    names: list[tuple[str, str, tuple, str]] = []
    for fname, listed in weight_files(d).items():
        with safe_open(str(d / fname), framework="pt", device="cpu") as f:
            for n in (listed if listed is not None else f.keys()):
                sl = f.get_slice(n)
                names.append((n, fname, tuple(sl.get_shape()), sl.get_dtype()))
    stored = {n for n, *_ in names}
    prefix, head = next(((p, h) for p, h in _SPELLINGS if any(n.startswith(p) for n in stored)), _SPELLINGS[0])
    carried = []
    for n, fname, shape, dt in names:
        if n.startswith(prefix) or n == head:
            continue
        if dt not in _DTYPES:
            raise HorizonError(f"{d / fname}: tensor {n!r} has dtype {dt}; --save-hf carries floating-point "
                               "tensors only")
        carried.append(Carried(n, fname, shape, _DTYPES[dt]))
    return Wrapped(d, mt, prefix, head, tuple(carried))
