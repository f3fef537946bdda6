"""A frozen base stored quantized on the host (Policy.base_quant, docs/adapters.md): which of a
block's tensors are quantized, and where each lies, to the byte, in the block's one uint8 host
buffer. The planner sizes the host store and the link's bytes from this, and the executor packs
and unpacks the buffer by the same regions (horizon_exec/model/quant.py), so the two cannot
disagree on a layout.

Formats (bitsandbytes' own, so a run's base equals QLoRA's on the same weights, bit for bit):
  nf4   4-bit NormalFloat codes, two a byte (the first element in the high nibble), in blocks
        of 64 elements of the flattened tensor, each scaled by its absmax; double quantization
        (QLoRA's): the absmaxes less their mean are 8-bit codes of bitsandbytes' dynamic map
        in blocks of 256, each with an fp32 scale, and the mean one fp32 offset
  int8  one int8 per element, per row of the stored tensor (its last dimension) scaled by the
        row's absmax / 127 (bitsandbytes' int8_vectorwise_quant, LLM.int8's weight format,
        with no outlier columns)
Quantized: every projection's weight (routed experts' stacked ones too), not an MoE router
(its top-k decides which experts run: kept exact, as QLoRA keeps the gate), biases or norms,
which stay in the compute dtype. The embedding and the head are never quantized (QLoRA keeps
them in the compute dtype). Every region starts on a 16-byte boundary, so each is a view of
the buffer in its own dtype."""
import math
from dataclasses import dataclass
from functools import lru_cache

from horizon_sim.specs import block

QUANT_FORMATS = ("none", "nf4", "int8")
"""Policy.base_quant's values: 'none' keeps the frozen base in the compute dtype."""
NF4_BLOCK = 64
"""Elements per NF4 absmax (bitsandbytes' 4-bit blocksize, QLoRA's)."""
NF4_STATS_BLOCK = 256
"""Absmaxes per second-level fp32 scale (bitsandbytes' double quantization)."""
ALIGN = 16
"""Every region's offset is a multiple of this (a view in any dtype; 16 bytes, not 4, so a
device copy of the buffer can vectorise)."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True, slots=True)
class Region:
    """One array of a unit's quantized buffer: `nbytes` from `offset`, `numel` of `dtype`."""
    offset: int
    numel: int
    dtype: str  # 'uint8' | 'int8' | 'fp32' | the compute dtype's name

    @property
    def nbytes(self) -> int:
        return self.numel * {"uint8": 1, "int8": 1, "bf16": 2, "fp32": 4}[self.dtype]


@dataclass(frozen=True, slots=True)
class QuantTensor:
    """Where one of the block's tensors lies: `regions` by role. A tensor kept as it is has
    'raw' (the compute dtype); nf4 'codes', 'absmax' (the absmaxes' uint8 codes), 'absmax2'
    (their fp32 scales) and 'offset'; int8 'codes' and 'scales' (fp32, one a row)."""
    name: str
    shape: tuple[int, ...]
    fmt: str  # 'raw' | 'nf4' | 'int8'
    regions: dict

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def quantized(m, name: str) -> bool:
    """Whether the block tensor `name` is quantized under a quantized base (module docstring)."""
    return name in _quantized_names(m)


@lru_cache(maxsize=64)
def _quantized_names(m) -> frozenset:
    return frozenset(p.tensor for p in block.projections(m) if not (m.n_experts and p.module in block.ROUTERS))


def _parts(fmt: str, shape: tuple[int, ...], compute_dtype: str) -> list[tuple[str, int, str]]:
    """(role, elements, dtype) of a tensor's regions in the buffer, in order."""
    n = math.prod(shape)
    if fmt == "raw":
        return [("raw", n, compute_dtype)]
    if fmt == "nf4":
        blocks = -(-n // NF4_BLOCK)
        return [("codes", -(-n // 2), "uint8"), ("absmax", blocks, "uint8"),
                ("absmax2", -(-blocks // NF4_STATS_BLOCK), "fp32"), ("offset", 1, "fp32")]
    rows = n // shape[-1]
    return [("codes", n, "int8"), ("scales", rows, "fp32")]


@lru_cache(maxsize=64)
def unit_layout(m, base_quant: str, compute_dtype: str) -> tuple[tuple[QuantTensor, ...], int]:
    """The block's tensors in transformers' order with their regions, and the buffer's bytes."""
    if base_quant not in QUANT_FORMATS[1:]:
        raise ValueError(f"base_quant={base_quant!r}: a layout exists for {QUANT_FORMATS[1:]}")
    out, off = [], 0
    for name, shape in block.parameters(m):
        fmt = base_quant if quantized(m, name) else "raw"
        regions = {}
        for role, numel, dtype in _parts(fmt, tuple(shape), compute_dtype):
            r = Region(off, numel, dtype)
            regions[role] = r
            off = _aligned(off + r.nbytes)
        out.append(QuantTensor(name, tuple(shape), fmt, regions))
    return tuple(out), off


def quantized_params(m) -> int:
    """A block's quantized elements (under either format)."""
    return sum(math.prod(s) for n, s in block.parameters(m) if quantized(m, n))


def unit_bytes(m, base_quant: str, compute_dtype: str) -> int:
    """A quantized block's host bytes (what it also sends over the link)."""
    return unit_layout(m, base_quant, compute_dtype)[1]


def base_bytes(m, base_quant: str, compute_dtype: str) -> int:
    """A frozen base's host bytes: its blocks packed (or in the compute dtype), the embedding
    and the head in the compute dtype (the Schedule's buffers, less their padding)."""
    a = {"bf16": 2, "fp32": 4}[compute_dtype]
    blocks = (sum(n * unit_bytes(s, base_quant, compute_dtype) for s, n in m.block_shapes) if base_quant != "none"
              else m.blocks_params * a)
    return blocks + (m.total_params - m.blocks_params) * a


DEQUANT_CHUNK = 1 << 23
"""Elements a dequantization turns into the compute dtype at a time on a GPU: its temporaries
are a chunk's, not a whole matrix's (an expert stack is billions of elements), and a chunk is
still large enough that its ~10 kernels' launches are a small part of the GPU's time on it."""
DEQUANT_CHUNK_CPU = 1 << 20
"""The same on the CPU backend, where no launch costs and a chunk's temporaries stay in the
caches: 1.5 ns a parameter here against 3.7 at DEQUANT_CHUNK (nf4, one thread, this project's
EPYC VM). Both are multiples of NF4_BLOCK x NF4_STATS_BLOCK (a chunk starts on a scale)."""
DEQUANT_TEMP_BYTES = {"nf4": 7, "int8": 5}
"""Bytes of temporaries per element of a chunk in the executor's dequantization: nf4 the packed
bytes as int32 indices (2 a value) and the fp32 values; int8 the fp32 values; and each chunk's
absmaxes or row scales. An upper bound on what model/quant.py holds at once (tested)."""


def dequant_traffic_bytes(m, base_quant: str, a: int) -> int:
    """Device memory traffic of dequantizing one block into its slot: per quantized element,
    the codes read, the int32 indices (one per two elements) and the fp32 values written and
    read once, the output written in the compute dtype (a bytes); the raw tensors copied."""
    layout, _ = unit_layout(m, base_quant, "bf16" if a == 2 else "fp32")
    per = {"nf4": 0.5 + 2 * 2 + 2 * 4 + a, "int8": 1 + 2 * 4 + a}[base_quant]
    total = 0.0
    for t in layout:
        total += 2 * a * t.numel if t.fmt == "raw" else per * t.numel
    return int(total)


def dequant_workspace_bytes(m, base_quant: str, compute_dtype: str) -> int:
    """What a load holds on the device beside the slot: the block's quantized bytes as they
    crossed the link, and one chunk's temporaries."""
    layout, nbytes = unit_layout(m, base_quant, compute_dtype)
    largest = max((t.numel for t in layout if t.fmt != "raw"), default=0)
    return nbytes + min(largest, DEQUANT_CHUNK) * DEQUANT_TEMP_BYTES[base_quant]  # (the larger chunk's)
