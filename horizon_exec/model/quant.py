"""A quantized frozen base (Policy.base_quant): a block's tensors packed into its uint8 host
buffer, and unpacked on the device into its weight slot as it loads, by the regions
horizon_sim/specs/quant.py lays out (so the planner's bytes are the store's).

The formats are bitsandbytes' (specs/quant.py), computed the way its reference ops compute them
(bitsandbytes/backends/default/ops.py: quantize_4bit, quantize_blockwise, dequantize_4bit,
int8_vectorwise_quant), in torch, so they run on any device and give its codes bit for bit
(tests/test_quant_base.py checks them against bitsandbytes). Dequantization runs a chunk at a
time (DEQUANT_CHUNK elements on a GPU, DEQUANT_CHUNK_CPU on the CPU backend), in fp32, rounded
once into the compute dtype, as bitsandbytes' kernels do."""
import torch

from horizon_exec.dtypes import TORCH_DTYPE
from horizon_sim.specs.quant import DEQUANT_CHUNK, DEQUANT_CHUNK_CPU, NF4_BLOCK, NF4_STATS_BLOCK, unit_layout

NF4_CODE = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
            -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
            0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
            0.7229568362236023, 1.0)
"""The 16 NormalFloat4 values (QLoRA; bitsandbytes' get_4bit_type('nf4'))."""


def dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True, 7, 8)), the code
    of double quantization's absmaxes: 256 sorted values in [-1, 1]."""
    data = []
    for i in range(7):
        items = 2 ** i + 1  # 2^(i + 7 - 7) + 1 fraction boundaries at exponent i
        bounds = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


_TABLES: dict = {}


def _table(name: str, device) -> torch.Tensor:
    """'nf4': the 16 values; 'pairs': (256, 2), a byte's two values (high nibble first), so one
    gather of the packed bytes unpacks them; 'dynamic': the absmaxes' 8-bit map."""
    key = (name, str(device))
    if key not in _TABLES:
        code = torch.tensor(NF4_CODE, dtype=torch.float32)
        t = {"nf4": code, "pairs": torch.stack([code.repeat_interleave(16), code.repeat(16)], dim=1),
             "dynamic": dynamic_map()}[name]
        _TABLES[key] = t.to(device)
    return _TABLES[key]


def _nearest(scaled: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index of the nearest value of the sorted `code` (ties to the upper, as bucketize on the midpoints)."""
    return torch.bucketize(scaled, (code[:-1] + code[1:]) / 2, out_int32=True).to(torch.uint8)


def _blockwise(a: torch.Tensor, block: int, code: torch.Tensor):
    """(codes uint8, absmax fp32) of flat fp32 `a` in blocks of `block` (the last one short)."""
    n = a.numel()
    full = n - n % block
    absmax = a[:full].view(-1, block).abs().amax(dim=1)
    scaled = torch.clamp(a[:full].view(-1, block) * (1.0 / absmax.clamp(min=1e-38)).view(-1, 1), -1, 1).reshape(-1)
    if n % block:
        last = a[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, last.view(1)])
        scaled = torch.cat([scaled, torch.clamp(a[full:] / last, -1, 1)])
    return _nearest(scaled, code), absmax


def nf4_quantize(w: torch.Tensor) -> dict:
    """NF4 with double quantization of `w` (any shape, flattened): {codes, absmax, absmax2, offset}."""
    a = w.reshape(-1).float()
    q, absmax = _blockwise(a, NF4_BLOCK, _table("nf4", a.device))
    if q.numel() % 2:  # an odd count: the last byte's low half is the code of 0.0 (bitsandbytes pads with 0.0)
        q = torch.cat([q, torch.full((1,), NF4_CODE.index(0.0), dtype=q.dtype, device=q.device)])
    offset = absmax.mean()
    qabs, absmax2 = _blockwise(absmax - offset, NF4_STATS_BLOCK, _table("dynamic", a.device))
    return {"codes": (q[::2] << 4) | q[1::2], "absmax": qabs, "absmax2": absmax2, "offset": offset.view(1)}


def int8_quantize(w: torch.Tensor) -> dict:
    """Row-wise int8 of `w` (rows: its last dimension): {codes, scales} (scales: the rows' absmax)."""
    rows = w.reshape(-1, w.shape[-1]).float()
    absmax = rows.abs().amax(dim=1)
    codes = torch.round(rows * (127.0 / absmax.unsqueeze(-1))).to(torch.int8)
    return {"codes": codes.reshape(-1), "scales": absmax}


def _chunk(device) -> int:
    """Elements a dequantization takes at a time on `device` (specs/quant.py)."""
    return DEQUANT_CHUNK_CPU if device.type == "cpu" else DEQUANT_CHUNK


def nf4_dequantize_(out: torch.Tensor, r: dict) -> None:
    """out (flat, the compute dtype) <- the NF4 tensor of regions r (views), a chunk at a time."""
    pairs, dyn = _table("pairs", out.device), _table("dynamic", out.device)
    n, chunk = out.numel(), _chunk(out.device)
    per2 = NF4_BLOCK * NF4_STATS_BLOCK  # elements under one second-level scale: chunks start on one
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        b0, b1 = s // NF4_BLOCK, -(-e // NF4_BLOCK)
        qa = r["absmax"][b0:b1]
        scale2 = r["absmax2"][s // per2:-(-e // per2)].repeat_interleave(NF4_STATS_BLOCK)[:b1 - b0]
        absmax = dyn[qa.int()] * scale2 + r["offset"]          # the blocks' absmaxes, fp32
        packed = r["codes"][s // 2:-(-e // 2)]
        vals = torch.index_select(pairs, 0, packed.int()).view(-1)[:e - s]  # fp32, as bitsandbytes keeps it
        full = (e - s) - (e - s) % NF4_BLOCK
        vals[:full].view(-1, NF4_BLOCK).mul_(absmax[:full // NF4_BLOCK].view(-1, 1))
        if full < e - s:
            vals[full:].mul_(absmax[-1])
        out[s:e].copy_(vals)
        del vals, packed  # before the next chunk's: one chunk's temporaries at a time


def int8_dequantize_(out: torch.Tensor, r: dict, row: int) -> None:
    """out (flat) <- the int8 tensor of regions r, rows of `row` elements, whole rows a chunk."""
    rows_per = max(1, _chunk(out.device) // row)
    scales, codes = r["scales"], r["codes"]
    for i in range(0, scales.numel(), rows_per):
        j = min(scales.numel(), i + rows_per)
        vals = codes[i * row:j * row].view(j - i, row).float()
        vals.mul_(scales[i:j].view(-1, 1) * (1.0 / 127))
        out[i * row:j * row].copy_(vals.view(-1))
        del vals  # before the next chunk's


class QuantUnit:
    """A block's quantized buffer: its regions (specs/quant.unit_layout) as views of any uint8
    tensor of its size, packed from and unpacked into the block's flat tensor in the compute dtype
    (or fp32)."""

    def __init__(self, model, base_quant: str, compute_dtype: str):
        self.layout, self.nbytes = unit_layout(model, base_quant, compute_dtype)
        self.compute = TORCH_DTYPE[compute_dtype]

    def regions(self, buf: torch.Tensor, t) -> dict:
        """Tensor t's regions as views of `buf` (uint8, self.nbytes)."""
        dt = {"uint8": torch.uint8, "int8": torch.int8, "fp32": torch.float32}
        return {role: buf[r.offset:r.offset + r.nbytes].view(dt.get(r.dtype, self.compute))
                for role, r in t.regions.items()}

    @torch.no_grad()
    def pack_(self, buf: torch.Tensor, whole: torch.Tensor, given: dict | None = None) -> None:
        """buf <- the block `whole` (flat, block_layout's order, any float dtype) quantized; an nf4
        tensor in `given` ({name: regions}, e.g. read packed from a checkpoint) copied as it is."""
        off = 0
        for t in self.layout:
            w = whole[off:off + t.numel].view(t.shape)
            off += t.numel
            dst = self.regions(buf, t)
            if t.fmt == "raw":
                dst["raw"].copy_(w.reshape(-1))
                continue
            src = (given or {}).get(t.name) if t.fmt == "nf4" else None
            for role, v in (src if src is not None else nf4_quantize(w) if t.fmt == "nf4" else int8_quantize(w)).items():
                dst[role].copy_(v.reshape(-1))

    @torch.no_grad()
    def unpack_(self, out: torch.Tensor, buf: torch.Tensor) -> None:
        """out (flat, the block's elements) <- the block dequantized from buf (on out's device)."""
        off = 0
        for t in self.layout:
            dst = out[off:off + t.numel]
            off += t.numel
            r = self.regions(buf, t)
            if t.fmt == "raw":
                dst.copy_(r["raw"])
            elif t.fmt == "nf4":
                nf4_dequantize_(dst, r)
            else:
                int8_dequantize_(dst, r, t.shape[-1])


class QuantUnits:
    """Every block's QuantUnit: one per block shape (a model with dense blocks before its MoE ones
    has two layouts, ModelSpec.block_spec)."""

    def __init__(self, model, base_quant: str, compute_dtype: str):
        self.m, self.base_quant, self.compute_dtype = model, base_quant, compute_dtype
        self._units: dict = {}

    def of(self, u: int) -> QuantUnit:
        """Block u's QuantUnit (its shape's)."""
        spec = self.m.block_spec(u)
        if spec not in self._units:
            self._units[spec] = QuantUnit(spec, self.base_quant, self.compute_dtype)
        return self._units[spec]
