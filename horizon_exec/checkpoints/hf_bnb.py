"""A checkpoint saved by transformers' bitsandbytes 4-bit integration (BitsAndBytesConfig with
load_in_4bit, bnb_4bit_quant_type nf4 and bnb_4bit_use_double_quant: QLoRA's, and the
'-bnb-4bit' checkpoints people download). Each quantized Linear's weight is stored as parts:

    <m>.weight                                      the packed 4-bit codes, uint8
    <m>.weight.absmax                               the blocks' absmaxes as 8-bit codes, uint8
    <m>.weight.nested_absmax                        their fp32 scales, one per 256
    <m>.weight.quant_map, .nested_quant_map         the two code tables (NF4's, the dynamic map)
    <m>.weight.quant_state.bitsandbytes__nf4        JSON: shape, blocksize, nested_blocksize, nested_offset

These are Horizon's nf4 regions (horizon_sim/specs/quant.py) bit for bit, so a run on an nf4 base
(Policy.base_quant) takes them as they are; any other run dequantizes them (model/quant.py).
Other bitsandbytes formats (fp4, int8, no double quantization, other block sizes) are refused."""
from dataclasses import dataclass

import torch

from horizon_exec.model import quant as Q
from horizon_sim.errors import HorizonError
from horizon_sim.safe_read import loads_json
from horizon_sim.specs.quant import NF4_BLOCK, NF4_STATS_BLOCK

STATE = ".quant_state.bitsandbytes__nf4"
PARTS = (".absmax", ".nested_absmax", ".quant_map", ".nested_quant_map", STATE)
"""What a packed weight's name is followed by in its parts' names."""


def packed_weights(names) -> set[str]:
    """The stored names that are packed weights (they have a quant state beside them)."""
    return {n.removesuffix(STATE) for n in names if n.endswith(STATE)}


def is_part(name: str, packed: set[str]) -> bool:
    """A packed weight's part other than its codes (read with them)."""
    return any(name.endswith(s) and name.removesuffix(s) in packed for s in PARTS)


@dataclass(frozen=True)
class PackedNF4:
    """One weight's parts, checked: model/quant.py's regions of an nf4 tensor."""
    shape: tuple[int, ...]
    regions: dict

    def dequantized(self) -> torch.Tensor:
        """The weight in fp32, as bitsandbytes' dequantize_4bit gives it."""
        out = torch.empty(self.shape)
        Q.nf4_dequantize_(out.view(-1), self.regions)
        return out


def read_packed(f, name: str, where) -> PackedNF4:
    """The packed weight `name` from the open safetensors file f, its parts checked against the
    format Horizon reads; HorizonError naming what differs."""
    def get(suffix):
        try:
            return f.get_tensor(name + suffix)
        except Exception:
            raise HorizonError(f"{where}: the 4-bit weight {name!r} has no {name + suffix!r} beside it "
                               "(bitsandbytes' nf4 with double quantization stores it)") from None
    state = loads_json(bytes(get(STATE).tolist()), f"{where}: {name + STATE}")
    if not isinstance(state, dict):
        raise HorizonError(f"{where}: {name + STATE!r} is not bitsandbytes' JSON quant state (an object)")
    want = {"quant_type": "nf4", "blocksize": NF4_BLOCK, "nested_blocksize": NF4_STATS_BLOCK}
    for k, v in want.items():
        if state.get(k) != v:
            raise HorizonError(f"{where}: {name!r} is stored with {k} = {state.get(k)!r}; Horizon reads bitsandbytes' "
                               f"nf4 with double quantization, {k} = {v!r}")
    shape = tuple(int(d) for d in state.get("shape", ()))
    n = 1
    for d in shape:
        n *= d
    codes, absmax, absmax2 = get(""), get(".absmax"), get(".nested_absmax")
    if not torch.equal(get(".quant_map").float(), torch.tensor(Q.NF4_CODE)):
        raise HorizonError(f"{where}: {name!r}'s quant_map is not NF4's 16 values")
    if not torch.equal(get(".nested_quant_map").float(), Q.dynamic_map()):
        raise HorizonError(f"{where}: {name!r}'s nested_quant_map is not bitsandbytes' dynamic map")
    blocks = -(-n // NF4_BLOCK)
    for what, t, dtype, numel in (("codes", codes, torch.uint8, -(-n // 2)), ("absmax", absmax, torch.uint8, blocks),
                                  ("nested_absmax", absmax2, torch.float32, -(-blocks // NF4_STATS_BLOCK))):
        if t.dtype != dtype or t.numel() != numel:
            raise HorizonError(f"{where}: {name!r}'s {what} is {t.dtype} x {t.numel()}; a {list(shape)} weight in nf4 "
                               f"has {dtype} x {numel}")
    offset = torch.tensor([float(state.get("nested_offset", float("nan")))], dtype=torch.float32)
    if not torch.isfinite(offset).all() or not torch.isfinite(absmax2).all():
        raise HorizonError(f"{where}: {name!r}'s scales are not finite")
    return PackedNF4(shape, {"codes": codes.reshape(-1), "absmax": absmax.reshape(-1), "absmax2": absmax2.reshape(-1),
                             "offset": offset})
