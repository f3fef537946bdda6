"""MXFP4, the format gpt-oss checkpoints (openai/gpt-oss-20b, -120b) store their MoE expert weights
in (the OCP Microscaling spec's MXFP4). Instead of the parameter, each layer stores two parts:

    <m>.mlp.experts.gate_up_proj_blocks   (E, 2I, H/32, 16) uint8: two FP4 (e2m1) codes a byte, low nibble first
    <m>.mlp.experts.gate_up_proj_scales   (E, 2I, H/32)     uint8: one E8M0 exponent per 32 values, biased by 127
    <m>.mlp.experts.down_proj_blocks      (E, H, I/32, 16)
    <m>.mlp.experts.down_proj_scales      (E, H, I/32)

The parts are the weight in its stored (E, out, in) orientation; the parameter transformers holds
(gate_up_proj (E, H, 2I), down_proj (E, I, H)) is that tensor transposed on its last two dims.
dequantize() is transformers' _convert_moe_packed_tensors (integrations/mxfp4.py) bit for bit, less
its final transpose; held() adds it. quantize() is the inverse the tests use to write small gpt-oss
checkpoints. read() takes a pair from an open safetensors file, checked."""
import torch

from horizon_sim.errors import HorizonError

FP4_VALUES = (+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The e2m1 value of each 4-bit code: magnitude in the low 3 bits, sign in the top one."""
MXFP4_BLOCK = 32
"""Values sharing one scale (16 bytes of codes)."""
BLOCKS, SCALES = "_blocks", "_scales"
"""What a held parameter's name is followed by in its two parts' names."""
_HELD = ("gate_up_proj", "down_proj")
E8M0_BIAS, E8M0_NAN = 127, 255

_CHUNK_ROWS = 1 << 18
"""Blocks of 32 dequantized at a time. A chunk's temporaries (the masked nibbles, their int32 index, the
16 values looked up, the exponents) are under 150 bytes a row, so under 40 MiB, where over the whole of a
gpt-oss-120b layer's gate_up_proj (128 * 5760 * 90 = 66M rows) each would take GiBs (transformers'
default chunk, 2^25 rows, keeps 2 GiB int32 indexes); and 2^18 rows keep that layer to ~250 steps, so the
loop's Python overhead is nothing next to the work."""


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight (..., G*32) in the stored (..., out, in) orientation, from blocks (..., G, 16) and
    scales (..., G): code value times 2^(scale - 127). The same operations as transformers'
    _convert_moe_packed_tensors (lookup in a table of `dtype`, then torch.ldexp), so the same bits."""
    *prefix, G, B = blocks.shape
    if tuple(scales.shape) != (*prefix, G):
        raise HorizonError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not pair "
                           "(the scales have the blocks' shape less its last dim)")
    rows = blocks.numel() // B if B else 0
    codes = blocks.to(torch.uint8).reshape(rows, B)
    exps = scales.reshape(rows, 1)
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    out = torch.empty(rows, 2 * B, dtype=dtype, device=blocks.device)
    for r0 in range(0, rows, _CHUNK_ROWS):
        blk, sub = codes[r0:r0 + _CHUNK_ROWS], out[r0:r0 + _CHUNK_ROWS]
        sub[:, 0::2] = lut[(blk & 0x0F).to(torch.int32)]
        sub[:, 1::2] = lut[(blk >> 4).to(torch.int32)]
        torch.ldexp(sub, exps[r0:r0 + _CHUNK_ROWS].to(torch.int32) - E8M0_BIAS, out=sub)
    return out.view(*prefix, G * 2 * B)


def held(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32, out=None) -> torch.Tensor:
    """The parameter as transformers holds it, (..., in, out): dequantize() transposed on its last two
    dims, contiguous, or written into `out` (a view of the master: no whole-tensor temporary). Done one
    leading index (an expert) at a time, so the peak is the result plus one expert's dequantized matrix
    rather than the whole stored tensor twice."""
    if blocks.dim() < 3:
        raise HorizonError(f"MXFP4 blocks {list(blocks.shape)} have no (out, in/32, 16) matrix to transpose")
    *lead, out_dim, G, B = blocks.shape
    res = out if out is not None else torch.empty(*lead, G * 2 * B, out_dim, dtype=dtype, device=blocks.device)
    flat_res = res.view(-1, G * 2 * B, out_dim)
    flat_blocks, flat_scales = blocks.reshape(-1, out_dim, G, B), scales.reshape(-1, out_dim, G)
    for i in range(flat_res.shape[0]):
        flat_res[i].copy_(dequantize(flat_blocks[i], flat_scales[i], dtype).transpose(0, 1))
    return res


def quantize(w_stored: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, scales) for an fp32 weight (..., out, in) in the stored orientation, in a multiple of 32,
    per the OCP Microscaling spec: each block of 32 shares the exponent e = floor(log2(max|x|)) - 2 (2 is
    e2m1's largest exponent), clamped to E8M0's [-127, 127], and each x / 2^e goes to the nearest of
    {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code, saturating at 6; the sign (of zeros too, so
    -0.0 survives) goes in the nibble's top bit. An all-zero block gets scale 127 (2^0): every scale
    decodes it to zeros, and 127 is the neutral one.

    dequantize(quantize(w)) == w for any w whose blocks are already representable. Otherwise an element
    is off by at most half its spacing times 2^e (<= 2^e for |x| <= 6 * 2^e); the spec's exponent puts a
    block's max in [4, 8) * 2^e, so elements above 6 * 2^e saturate, off by less than 2 * 2^e."""
    if w_stored.dtype != torch.float32 or w_stored.dim() < 1 or w_stored.shape[-1] % MXFP4_BLOCK:
        raise HorizonError(f"quantize takes an fp32 tensor whose last dim is a multiple of {MXFP4_BLOCK}, "
                           f"not {w_stored.dtype} {list(w_stored.shape)}")
    if not torch.isfinite(w_stored).all():
        raise HorizonError("quantize: the weight has non-finite values, which MXFP4 cannot store")
    *prefix, n = w_stored.shape
    x = w_stored.reshape(*prefix, n // MXFP4_BLOCK, MXFP4_BLOCK)
    amax = x.abs().amax(dim=-1)
    _, k = torch.frexp(amax)  # amax = m * 2^k, m in [0.5, 1): floor(log2(amax)) = k - 1, exact, subnormals too
    e = (k - 1 - 2).clamp(-E8M0_BIAS, E8M0_BIAS)
    e = torch.where(amax == 0, torch.zeros_like(e), e)
    y = torch.ldexp(x.abs(), -e.unsqueeze(-1))  # exact: a power-of-two scaling (an underflow only far below 0.25)
    # Count the midpoints y is past; at a midpoint `>` keeps the lower code, `>=` takes the upper: the even one.
    code = ((y > 0.25).to(torch.uint8) + (y >= 0.75) + (y > 1.25) + (y >= 1.75)
            + (y > 2.5) + (y >= 3.5) + (y > 5.0))
    code |= torch.signbit(x).to(torch.uint8) << 3
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.contiguous(), (e + E8M0_BIAS).to(torch.uint8)


def stored_names(held_name: str) -> tuple[str, str]:
    """(blocks name, scales name) of a held expert parameter's parts."""
    return held_name + BLOCKS, held_name + SCALES


def is_mxfp4_part(name: str) -> bool:
    """A stored name that is an MXFP4 part of an expert stack (read with its pair by read())."""
    return any(name.endswith(h + s) for h in _HELD for s in (BLOCKS, SCALES))


def read(f, held_name: str, where, shape, out=None) -> torch.Tensor:
    """The parameter `held_name` in fp32 as transformers holds it, from its two MXFP4 parts in the open
    safetensors file f (written into `out` when given), checked: both there, uint8, paired shapes, the
    held shape the model's `shape`, no scale of 255 (E8M0's NaN); HorizonError naming what differs."""
    names = stored_names(held_name)
    keys = set(f.keys())
    for n in names:
        if n not in keys:
            raise HorizonError(f"{where}: the MXFP4 weight {held_name!r} has no {n!r} (gpt-oss checkpoints store "
                               f"{names[0]!r} and {names[1]!r})")
    blocks, scales = (f.get_tensor(n) for n in names)
    for n, t in zip(names, (blocks, scales)):
        if t.dtype != torch.uint8:
            raise HorizonError(f"{where}: {n!r} is {t.dtype}; MXFP4 parts are uint8")
    if blocks.dim() < 3 or blocks.shape[-1] != MXFP4_BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise HorizonError(f"{where}: {names[0]!r} {list(blocks.shape)} and {names[1]!r} {list(scales.shape)} are not "
                           f"MXFP4 parts ((..., out, in/32, {MXFP4_BLOCK // 2}) and (..., out, in/32))")
    got = (*blocks.shape[:-3], blocks.shape[-2] * MXFP4_BLOCK, blocks.shape[-3])
    if got != tuple(shape):
        raise HorizonError(f"{where}: {held_name!r} is stored as {list(got)} (from {names[0]!r}); "
                           f"the model's is {list(shape)}")
    if (scales == E8M0_NAN).any():
        raise HorizonError(f"{where}: {names[1]!r} has a scale of {E8M0_NAN} (E8M0's NaN)")
    return held(blocks, scales, out=out)
