"""Block-wise FP8 checkpoints: how DeepSeek-V3 ships on the hub (and the "-FP8" releases of other
families). Each quantized weight is stored as float8_e4m3fn, with its scales beside it as
`<weight>_scale_inv` (fp32, one per block of weight_block_size, 128 x 128: the weight is the fp8
values times their block's scale); config.json says so with quantization_config {"quant_method":
"fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}.

Horizon trains full-precision weights, so these are dequantized on load, W[i, j] = q[i, j] (as
fp32) x scale[i // bm, j // bn]: DeepSeek's reference rule, whose scale grid covers a shape that
is not a multiple of the block with partial blocks; on a shape that is a multiple it is
transformers' Fp8Dequantize to the bit (the same fp32 product). quantize() is the inverse the
tests use to write small checkpoints."""
import torch

from horizon_sim.errors import HorizonError

SCALE = "_scale_inv"
"""What a quantized weight's name is followed by in its scales' name."""
FP8_MAX = 448.0
"""float8_e4m3fn's largest finite value."""


def is_scale(name: str) -> bool:
    """A stored name that is a weight's block scales (read with its weight)."""
    return name.endswith(".weight" + SCALE)


def _expand(scale: torch.Tensor, rows: int, cols: int, block: tuple[int, int]) -> torch.Tensor:
    bm, bn = block
    return scale.repeat_interleave(bm, dim=-2)[..., :rows, :].repeat_interleave(bn, dim=-1)[..., :cols]


def dequantize(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The fp32 weight of fp8 values q (..., rows, cols) and their blocks' scales (..., ceil(rows /
    bm), ceil(cols / bn))."""
    rows, cols = q.shape[-2:]
    return q.to(torch.float32) * _expand(scale.to(torch.float32), rows, cols, block)


def quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 values, fp32 block scales) of w (rows, cols): each block scaled so its largest
    magnitude is float8_e4m3fn's largest, an all-zero block by 1."""
    bm, bn = block
    rows, cols = w.shape
    grid = (-(-rows // bm), -(-cols // bn))
    padded = torch.zeros(grid[0] * bm, grid[1] * bn, dtype=torch.float32)
    padded[:rows, :cols] = w
    amax = padded.view(grid[0], bm, grid[1], bn).abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w / _expand(scale, rows, cols, block)).to(torch.float8_e4m3fn)
    return q, scale


def read(f, name: str, where, shape, block: tuple[int, int], out=None) -> torch.Tensor:
    """The fp32 weight `name` from its fp8 values and `name`_scale_inv in the open safetensors
    reader f (written into `out` when given), checked: the scales there, their grid the weight's
    under `block`, the values finite; HorizonError naming what differs."""
    scale_name = name + SCALE
    if scale_name not in set(f.keys()):
        raise HorizonError(f"{where}: the FP8 weight {name!r} has no {scale_name!r} beside it")
    q, scale = f.get_tensor(name), f.get_tensor(scale_name)
    if tuple(q.shape) != tuple(shape):
        raise HorizonError(f"{where}: tensor {name!r} has shape {tuple(q.shape)}, the model needs {tuple(shape)}")
    rows, cols = q.shape[-2:]
    grid = (*q.shape[:-2], -(-rows // block[0]), -(-cols // block[1]))
    if tuple(scale.shape) != grid:
        raise HorizonError(f"{where}: {scale_name!r} has shape {tuple(scale.shape)}; blocks of {list(block)} over "
                           f"{name!r} {list(q.shape)} make {list(grid)}")
    if not torch.isfinite(scale).all():
        raise HorizonError(f"{where}: {scale_name!r} holds non-finite scales")
    w = dequantize(q, scale, block)
    return out.copy_(w) if out is not None else w
