"""HardwareSpec: the machine a plan runs on, as three separate parts (Calculon style):
the device (memory, peak FLOP/s, memory bandwidth), the link between host and device
(achieved copy bandwidth and latency) and the host (RAM, DRAM bandwidth, CPU optimizer rate).
Units are in the field names: GiB = 2**30 bytes, GB/s = 1e9 bytes/s, TFLOPs = 1e12 FLOP/s.
Presets live in hardware_presets.py; TOML files are read and written by hardware_io.py."""
import math
from dataclasses import dataclass, asdict

from horizon_sim.errors import HorizonError
from horizon_sim.specs import ranges
from horizon_sim.specs.cluster import SINGLE, ClusterSpec
from horizon_sim.units import GiB


def _check_name(part: str, value) -> None:
    if not isinstance(value, str) or not value.strip():
        raise HorizonError(f"{part} name={value!r} must be a non-empty string")


def _check_number(spec, part: str, field: str, *, low: float = 0.0, low_ok: bool = False,
                  high: float | None = None) -> None:
    """`field` of `spec` must be a finite real number > low (>= low when low_ok) and <= high.
    Stores it back as a float so 80 and 80.0 compare and serialize the same way."""
    v = getattr(spec, field)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise HorizonError(f"{part} {field}={v!r} must be a finite number")
    if (v < low) if low_ok else (v <= low):
        raise HorizonError(f"{part} {field}={v!r} must be {'>=' if low_ok else '>'} {low:g}")
    if high is not None and v > high:
        raise HorizonError(f"{part} {field}={v!r} must be <= {high:g}")
    _check_range(part, field, v)
    object.__setattr__(spec, field, float(v))


def _check_whole(spec, part: str, field: str, low: int, what: str, high: int | None = None) -> None:
    """`field` of `spec` must be a whole number (not a bool) from low to high; `what` says so in
    the error ('a positive integer')."""
    v = getattr(spec, field)
    if not isinstance(v, int) or isinstance(v, bool) or v < low or (high is not None and v > high):
        raise HorizonError(f"{part} {field}={v!r} must be {what}")
    _check_range(part, field, v)


def _check_range(part: str, field: str, v) -> None:
    """The field's sane range (ranges.py): finite but absurd values overflow the planner."""
    b = ranges.bounds(part, field)
    if b and (why := ranges.out_of_range(v, *b)):
        raise HorizonError(f"{part} {field}={v!r} {why}")


TABLE_KEYS = {"dtype": ("bf16", "fp32"), "layout": ("nt", "nn", "tn"), "format": ("nf4", "int8")}
"""The values a key column may hold; op_overhead_us's `kind` takes an op kind, head_chunk or one
of MOE_OVERHEAD_KINDS, ADAPTER_OVERHEAD_KINDS or TRACKED_OVERHEAD_KINDS."""
MOE_OVERHEAD_KINDS = tuple(f"{k}_{what}" for k in ("forward", "recompute", "backward") for what in ("router", "expert"))
"""op_overhead_us kinds an MoE block adds to its compute op's fixed cost: '<kind>_router' once
per op, '<kind>_expert' per expert its loop runs."""
ADAPTER_OVERHEAD_KINDS = tuple(f"{k}_adapter" for k in ("forward", "recompute", "backward"))
"""op_overhead_us kinds a block with LoRA adapters (Policy.lora_rank) adds per adapted
projection: the dispatch of the adapter's dozen small kernels and the calls of its rank-r
GEMMs, beyond the work schedule/work.py prices (calibrate measures them; absent: 0)."""
def tracked_kind(kind: str) -> str:
    """The op_overhead_us kind of `kind` run with every op's temporaries measured (tracks_every_op)."""
    return f"{kind}_tracked"


TRACKED_OVERHEAD_KINDS = tuple(tracked_kind(k) for k in ("forward", "recompute", "backward", "head"))
"""op_overhead_us kinds of a CPU backend that measures every compute op's temporaries on every
run (tracks_every_op): '<kind>_tracked' replaces '<kind>' there. Measuring them is Python work
per kernel: the calibration's tiny model ran 20-60% slower per step that way."""


def tracks_every_op(model, policy) -> bool:
    """Whether the CPU backend measures every compute op's temporaries on every run, as its
    default (RuntimeConfig.track_memory 'auto') does where shapes move from step to step (MoE
    routing, document masks); elsewhere it measures an op once and replays it."""
    return bool(getattr(model, "n_experts", 0) or getattr(policy, "doc_masks", False))


SIZE_COLUMNS = ("M", "N", "K", "SEQ", "HEAD_DIM", "THREADS")
"""Numeric columns that are sizes: at least 1."""


def _allowed_keys(col: str) -> tuple[str, ...]:
    if col == "kind":
        from horizon_sim.schedule.op import OpKind  # lazily: the schedule package imports specs
        return (*(k.value for k in OpKind), "head_chunk", *MOE_OVERHEAD_KINDS, *ADAPTER_OVERHEAD_KINDS,
                *TRACKED_OVERHEAD_KINDS)
    return TABLE_KEYS[col]


def _check_table(spec, part: str, field: str, columns: tuple[str, ...]) -> None:
    """`field` of `spec` is a table: a sequence of rows, each with len(columns) cells; a column
    named in lower case is a key (one of its allowed strings: TABLE_KEYS, op kinds), the others
    are finite numbers > 0 (sizes >= 1). Stored back as a tuple of tuples (hashable, and a TOML
    array of arrays reads back equal)."""
    rows = getattr(spec, field)
    if isinstance(rows, dict):  # {key: value} is accepted for two-column tables
        rows = sorted(rows.items())
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise HorizonError(f"{part} {field}={rows!r} must be a list of rows ({', '.join(columns)})")
    out = []
    for row in rows:
        if isinstance(row, (str, bytes)) or not hasattr(row, "__iter__") or len(row := tuple(row)) != len(columns):
            raise HorizonError(f"{part} {field}: row {row!r} must have {len(columns)} cells "
                               f"({', '.join(columns)})")
        cells = []
        for col, v in zip(columns, row):
            if col.islower():
                allowed = _allowed_keys(col)
                if not isinstance(v, str) or v not in allowed:
                    raise HorizonError(f"{part} {field}: {col}={v!r} in row {row!r}; allowed: {', '.join(allowed)}")
                cells.append(v)
            else:
                low = 1 if col in SIZE_COLUMNS else 0
                if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                        or v < low or v == 0):
                    raise HorizonError(f"{part} {field}: {col}={v!r} in row {row!r} must be a finite number "
                                       + (">= 1" if low else "> 0"))
                if col in ranges.TABLE_CELLS and (why := ranges.out_of_range(v, *ranges.TABLE_CELLS[col])):
                    raise HorizonError(f"{part} {field}: {col}={v!r} in row {row!r} {why}")
                cells.append(float(v))
        out.append(tuple(cells))
    object.__setattr__(spec, field, tuple(out))


@dataclass(kw_only=True, frozen=True, slots=True)
class DeviceSpec:
    """One accelerator. The planner treats it as a transient compute engine: it holds a few
    layer buffers and an activation window, never the whole model."""

    name: str
    hbm_GiB: float
    """Device memory as the driver reports it (nvidia-smi memory.total), in GiB."""
    bf16_TFLOPs: float
    """Dense bf16 tensor-core peak with fp32 accumulate, no 2:4 sparsity, 1e12 FLOP/s."""
    fp32_TFLOPs: float
    """Plain FP32 (non-tensor-core) peak, 1e12 FLOP/s; what elementwise fp32 math can reach."""
    hbm_GBps: float
    """Peak device memory bandwidth, 1e9 bytes/s."""
    default_link: str
    """Name of the LinkSpec preset this device is usually attached with."""
    matmul_efficiency: float = 0.70
    """Achievable fraction of bf16_TFLOPs for large transformer GEMMs. 0.70 is an estimate
    (well-tuned cuBLAS GEMMs of LLM shapes typically land between 0.6 and 0.8 of the dense
    datasheet peak); `calibrate` measures it on a real device."""
    reserved_GiB: float = 1.5
    """Device memory tensors cannot use: CUDA context, cuBLAS/cuDNN workspaces and allocator
    slack (an estimate; the CUDA context alone is typically 0.3-0.6 GiB)."""
    library_workspace_MiB: float = 0.0
    """Device memory the math libraries take at the first matmul and keep: the cuBLAS and
    cuBLASLt workspaces of the compute stream, handed out by PyTorch's caching allocator and never
    given back, so part of every measured device peak. 0 on the CPU backend; the GPU presets cite
    their figure; `calibrate --device cuda` measures it."""
    launch_overhead_us: float = 8.0
    """Fixed cost of one schedule op on the device (the several kernel launches of one layer
    op and the gaps between them), microseconds. An estimate; calibrate measures it."""
    gemm_TFLOPs: tuple = ()
    """Measured GEMM throughput by shape, rows (DTYPE, LAYOUT, M, N, K, TFLOPS): C (M x N) =
    A (M x K) . B (K x N) in dtype 'bf16' or 'fp32'; layout 'nt' is x . W^T (forward), 'nn'
    dY . W (input gradients), 'tn' X^T . dY (weight gradients). Shapes between rows are
    interpolated in log space. Empty (the presets): every GEMM runs at the dtype's peak x
    matmul_efficiency. `calibrate` fills it."""
    attention_TFLOPs: tuple = ()
    """Measured causal attention (SDPA) throughput, rows (DTYPE, SEQ, HEAD_DIM, FWD, BWD) in
    1e12 FLOP/s of the nominal count: forward 2 x 2 x T^2 x head_dim per head and sequence,
    halved for the causal mask; backward twice the forward. Empty: attention FLOPs run at the
    dtype's peak x matmul_efficiency."""
    masked_attention_TFLOPs: tuple = ()
    """The same kernels under an explicit bool mask (sliding windows shorter than the sequence,
    document masks), rows (DTYPE, SEQ, HEAD_DIM, FWD, BWD) against the full count, forward
    4 x T^2 x head_dim per head and sequence: such kernels cannot skip masked tiles. Empty: the
    full count runs at attention_TFLOPs' rate."""
    softcap_attention_TFLOPs: tuple = ()
    """Measured soft-capped attention (Gemma 2's scores c x tanh(s / c)) in one fused kernel,
    torch's flex_attention (horizon_exec/model/flex_softcap.py), rows (DTYPE, SEQ, HEAD_DIM,
    FWD, BWD) in 1e12 FLOP/s of attention_TFLOPs' causal count (forward 4 x head_dim per head
    and (query, key) pair, backward twice that; a sliding window's skipped pairs are not
    counted). A GPU runs soft-capped attention so; the CPU backend in chunks of query rows,
    priced by attention_TFLOPs and its elementwise bytes. Empty: a GPU's soft-capped attention
    at attention_TFLOPs' rate."""
    elementwise_GBps: float = 0.0
    """What the executor's elementwise kernels (norms, RoPE, SiLU, residual adds, casts) reach,
    1e9 bytes/s of traffic; the step's elementwise work is priced at it. 0: hbm_GBps (a
    calibrated file writes its measured rate into hbm_GBps; the GH100 presets carry an H200's
    measured rate here, beside the datasheet peak)."""
    reduce_GBps: float = 0.0
    """Bandwidth of a squared-norm reduction over a gradient where it lies (what an offload
    does before the global norm), 1e9 bytes/s. 0: elementwise_GBps, else hbm_GBps."""
    loss_ns_per_logit: float = 0.0
    """Time per logit of the loss kernels of an LM-head chunk (fp32 upcast, logsumexp, target
    gather, the softmax gradient in place, cast back: Policy.loss_kernel 'torch'), nanoseconds.
    These are exp/log-bound, not bandwidth-bound. 0: the head's elementwise bytes / hbm_GBps."""
    fused_loss_ns_per_logit: float = 0.0
    """The same for the CPU backend's fused loss kernel (Policy.loss_kernel 'fused',
    native/xent.c), nanoseconds. 0 (not measured, or a GPU): the head's elementwise bytes for
    that kernel / hbm_GBps."""
    dequant_ns_per_param: tuple = ()
    """Time to dequantize a quantized base (Policy.base_quant) per quantized parameter on the lane
    that loads it (a GPU: a kernel on the copy stream; the CPU backend: one host-lane thread), rows
    (FORMAT, NS), e.g. ('nf4', 2.1), nanoseconds: the executor's kernels (horizon_exec/model/quant.py)
    gather codes from tables, which a byte count does not price. A format not listed: its bytes
    (specs/quant.dequant_traffic_bytes) at the elementwise rate."""
    op_overhead_us: tuple = ()
    """Measured fixed cost per compute op kind, rows (KIND, US): the Python dispatch of every
    kernel of the op, its memory tracking, launches and gaps, e.g. ('backward', 4200.0);
    'head_chunk' is the extra cost of each LM-head chunk after the first; an MoE block adds
    '<kind>_router' once and '<kind>_expert' per expert its loop runs, and a block with adapters
    '<kind>_adapter' per adapted projection (kind forward, recompute or backward; not listed:
    nothing extra). Other kinds not listed cost launch_overhead_us."""
    compute_threads: int = 0
    """CPU backend: the intra-op threads of the compute lane these rates were measured with
    (calibrate's split: all cores but one); 0: a GPU, or a CPU file from before this field."""
    thread_speed: tuple = ()
    """CPU backend: the compute lane's speed at each thread count it may be given, relative to
    the rates in this file, rows (THREADS, ALONE, SHARED): ALONE with the host lanes idle,
    SHARED while one host-lane thread copies beside it (on the lanes' own cores when THREADS <
    host cores, else on compute's). The planner prices a core split with it
    (horizon_sim/specs/core_split.py); `calibrate` measures it with the template block, in the
    dtype `horizon train` computes in on that machine by default (fp32 on a CPU without bf16
    matrix instructions), the same figures then scaling every dtype's rates. Empty: only the
    file's own split (compute_threads) can be priced."""
    thread_kernel_speed: tuple = ()
    """CPU backend: each kind of compute kernel's speed at each thread count, relative to the
    rates in this file, rows (THREADS, GEMM, ATTENTION, ELEMENTWISE): a kernel timed alone, so
    without the per-kernel dispatch the op overheads hold (op_overhead_us, which threads do not
    shorten), in the same dtype as thread_speed. A split scales each kind's rates by its own
    figure; `thread_speed` still gives the slowdown beside a busy host lane. Empty: every rate
    scales by thread_speed's ALONE."""

    def __post_init__(self):
        _check_name("device", self.name)
        for f in ("hbm_GiB", "bf16_TFLOPs", "fp32_TFLOPs", "hbm_GBps"):
            _check_number(self, "device", f)
        _check_name("device default_link", self.default_link)
        _check_number(self, "device", "matmul_efficiency", high=1.0)
        _check_number(self, "device", "reserved_GiB", low_ok=True)
        _check_number(self, "device", "library_workspace_MiB", low_ok=True)
        _check_number(self, "device", "launch_overhead_us", low_ok=True)
        _check_number(self, "device", "elementwise_GBps", low_ok=True)
        _check_number(self, "device", "reduce_GBps", low_ok=True)
        _check_number(self, "device", "loss_ns_per_logit", low_ok=True)
        _check_number(self, "device", "fused_loss_ns_per_logit", low_ok=True)
        _check_table(self, "device", "gemm_TFLOPs", ("dtype", "layout", "M", "N", "K", "TFLOPS"))
        _check_table(self, "device", "attention_TFLOPs", ("dtype", "SEQ", "HEAD_DIM", "FWD", "BWD"))
        _check_table(self, "device", "masked_attention_TFLOPs", ("dtype", "SEQ", "HEAD_DIM", "FWD", "BWD"))
        _check_table(self, "device", "softcap_attention_TFLOPs", ("dtype", "SEQ", "HEAD_DIM", "FWD", "BWD"))
        _check_table(self, "device", "op_overhead_us", ("kind", "US"))
        _check_table(self, "device", "dequant_ns_per_param", ("format", "NS"))
        _check_whole(self, "device", "compute_threads", 0, "a whole number >= 0", high=1 << 20)
        _check_table(self, "device", "thread_speed", ("THREADS", "ALONE", "SHARED"))
        _check_table(self, "device", "thread_kernel_speed", ("THREADS", "GEMM", "ATTENTION", "ELEMENTWISE"))
        if self.reserved_GiB >= self.hbm_GiB:
            raise HorizonError(f"device reserved_GiB={self.reserved_GiB:g} must be less than "
                               f"hbm_GiB={self.hbm_GiB:g}")


@dataclass(kw_only=True, frozen=True, slots=True)
class LinkSpec:
    """The host<->device link, described by what copies achieve, not by the wire rate.
    It owns its delay: a copy of n bytes takes latency_us + n / bandwidth."""

    name: str
    h2d_GBps: float
    """Achieved host-to-device bandwidth from pinned memory, 1e9 bytes/s (large copies)."""
    d2h_GBps: float
    """Achieved device-to-host bandwidth into pinned memory, 1e9 bytes/s."""
    latency_us: float
    """Fixed cost per transfer (launch, DMA setup, completion), microseconds."""
    pageable_GBps: float
    """Achieved bandwidth when the host buffer is pageable (staged through a driver bounce
    buffer by the CPU), 1e9 bytes/s."""
    busy_latency_us: float = 0.0
    """Extra fixed cost of a copy that runs while the compute lane is busy, microseconds (CPU
    backend: the copy thread waits for the interpreter lock the compute lane's kernel dispatch
    keeps taking, and shares the last-level cache with the compute core). 0 on DMA links."""
    cpu_driven: bool = False
    """Copies are made by host CPU threads rather than DMA engines (the CPU backend's emulated
    link): they then compete for the host lane cores (HostSpec.lane_cores) with the optimizer
    and each other, and the squared norm of an offloaded gradient is a host pass too."""

    def __post_init__(self):
        _check_name("link", self.name)
        for f in ("h2d_GBps", "d2h_GBps", "pageable_GBps"):
            _check_number(self, "link", f)
        _check_number(self, "link", "latency_us", low_ok=True)
        _check_number(self, "link", "busy_latency_us", low_ok=True)
        if not isinstance(self.cpu_driven, bool):
            raise HorizonError(f"link cpu_driven={self.cpu_driven!r} must be true or false")

    def h2d_seconds(self, nbytes: float, pinned: bool = True) -> float:
        """Time of one host-to-device copy of `nbytes`."""
        return self.latency_us * 1e-6 + nbytes / ((self.h2d_GBps if pinned else self.pageable_GBps) * 1e9)

    def d2h_seconds(self, nbytes: float, pinned: bool = True) -> float:
        """Time of one device-to-host copy of `nbytes`."""
        return self.latency_us * 1e-6 + nbytes / ((self.d2h_GBps if pinned else self.pageable_GBps) * 1e9)


@dataclass(kw_only=True, frozen=True, slots=True)
class HostSpec:
    """The host: its RAM is the parameter store (fp32 master weights, Adam moments) and its
    cores run the optimizer."""

    name: str
    ram_GiB: float
    """Installed RAM as the OS reports it (MemTotal), GiB."""
    dram_GBps: float
    """Achievable STREAM-like DRAM bandwidth, 1e9 bytes/s of traffic (bytes read plus bytes
    written), shared by DMA copies and the CPU optimizer. A DMA copy moves each byte across the
    bus once; a copy done by a CPU thread reads and writes it (twice)."""
    cores: int
    """Physical CPU cores available to the trainer."""
    adam_Gparams_per_s: float
    """Fused CPU AdamW rate with all cores when not DRAM-bound, 1e9 parameters/s."""
    deepspeed_adam_Gparams_per_s: float = 0.0
    """DeepSpeedCPUAdam's rate on this host with all cores, 1e9 parameters/s: what the ZeRO-3
    peer's optimizer runs at (horizon_sim/peer). It is DeepSpeed's own kernel, published or
    measured apart from Horizon's. 0: adam_Gparams_per_s (measured equal on this project's EPYC,
    benchmarks/adam_rates.py)."""
    os_reserved_GiB: float = 8.0
    """RAM the OS, a minimum page cache and other processes keep."""
    runtime_overhead_GiB: float = 4.0
    """Resident memory of the training process before any model tensor: Python, torch,
    CUDA libraries."""
    lane_cores: float = 0.0
    """Cores that the host-side lane threads share for CPU-bound work (the CPU lane always;
    the copy lanes too when the link is cpu_driven). Concurrent such work shares them equally
    (processor sharing: k flows on c cores each run at min(1, c/k) of their own speed).
    0: no such limit (each lane has cores of its own)."""
    thread_GBps: float = 0.0
    """What one host thread streams through DRAM in a gather, scatter or reduction (embedding
    rows, gradient accumulation), 1e9 bytes/s. 0: dram_GBps."""
    op_latency_us: float = 0.0
    """Fixed cost of one CPU-lane op (Python dispatch, thread hand-off), microseconds."""
    busy_latency_us: float = 0.0
    """Extra fixed cost of a CPU-lane op that runs while the compute lane is busy (waiting for
    the interpreter lock, shared cache), microseconds; 0: none."""
    disk_GiB: float = 0.0
    """Local disk space the disk tier may fill (policy disk_tier), GiB; 0: no disk tier."""
    disk_read_GBps: float = 0.0
    """Sequential read bandwidth of that disk into RAM, 1e9 bytes/s (`calibrate` measures it
    with the executor's reads; the presets cite NVMe datasheets)."""
    disk_write_GBps: float = 0.0
    """Sequential write bandwidth, 1e9 bytes/s."""
    disk_latency_us: float = 0.0
    """Fixed cost of one disk op (a unit's read or write), microseconds."""
    first_touch_GBps: float = 3.0
    """How fast one host thread writes into fresh pages, 1e9 bytes/s: the kernel faults in and
    zeroes each 4 KiB page on its first write. A large temporary the C library maps anew for
    each copy and unmaps after it (glibc maps every block over 32 MiB: PyTorch's CPU allocator
    caches nothing) is written at this rate, not at thread_GBps. Only the ZeRO-3 peer's
    v0.6-v0.7 gradient boundary (host_cast_at_boundary) pays it; Horizon's host buffers are
    allocated once."""
    compute_contention: float = 0.0
    """How much slower the compute lane runs while CPU-thread work streams on the host lane
    cores (copies on a cpu_driven link, the optimizer, host gathers), as a fraction: 0.1 = 10%
    slower. The CPU backend's compute core shares the last-level cache and DRAM bandwidth with
    those threads; `calibrate` measures the template block with a host thread copying beside
    it. 0 (the presets): a GPU computes apart from the host."""
    dram_channels: int = 0
    """Memory channels populated, all sockets together, counted as 64-bit DDR channels (a DDR5
    DIMM's two 32-bit subchannels are one): what dram_GBps is a fraction of. 0: not known (a
    calibrated host measures dram_GBps and records none)."""
    dram_MTps: float = 0.0
    """Their transfer rate, MT/s (DDR4-3200: 3200). 0: not known."""

    @property
    def dram_peak_GBps(self) -> float:
        """The channels' theoretical rate, 1e9 bytes/s: channels x MT/s x 8 bytes a transfer
        (0: not known). An achieved dram_GBps is a fraction of it (STREAM reaches ~60-80%)."""
        return self.dram_channels * self.dram_MTps * 8 / 1000

    def __post_init__(self):
        _check_name("host", self.name)
        for f in ("ram_GiB", "dram_GBps", "adam_Gparams_per_s"):
            _check_number(self, "host", f)
        for f in ("os_reserved_GiB", "runtime_overhead_GiB", "lane_cores", "thread_GBps", "op_latency_us",
                  "busy_latency_us", "compute_contention", "disk_GiB", "disk_read_GBps", "disk_write_GBps",
                  "disk_latency_us", "deepspeed_adam_Gparams_per_s"):
            _check_number(self, "host", f, low_ok=True)
        _check_number(self, "host", "first_touch_GBps")
        if self.disk_GiB and not (self.disk_read_GBps and self.disk_write_GBps):
            raise HorizonError(f"host disk_GiB={self.disk_GiB:g} needs disk_read_GBps and disk_write_GBps "
                               "(how fast the disk tier streams)")
        _check_whole(self, "host", "cores", 1, "a positive integer")
        _check_whole(self, "host", "dram_channels", 0, "a whole number >= 0 (0: not known)")
        _check_number(self, "host", "dram_MTps", low_ok=True)
        if bool(self.dram_channels) != bool(self.dram_MTps):
            raise HorizonError(f"host dram_channels={self.dram_channels} and dram_MTps={self.dram_MTps:g} go together: "
                               "give both (e.g. 16 and 3200 for 16 channels of DDR4-3200) or neither")
        if self.dram_channels and self.dram_GBps > self.dram_peak_GBps:
            raise HorizonError(f"host dram_GBps={self.dram_GBps:g} is above the {self.dram_peak_GBps:g} GB/s that "
                               f"dram_channels={self.dram_channels} x dram_MTps={self.dram_MTps:g} x 8 bytes can "
                               "carry: an achieved rate cannot exceed the channels' peak")
        if self.os_reserved_GiB >= self.ram_GiB:
            raise HorizonError(f"host ram_GiB={self.ram_GiB:g} must be more than "
                               f"os_reserved_GiB={self.os_reserved_GiB:g}")


@dataclass(kw_only=True, frozen=True, slots=True)
class HardwareSpec:
    """A machine: device + link + host, and the cluster of such devices and nodes (default:
    one device on one node). Host RAM is per node; the link is each device's."""

    device: DeviceSpec
    link: LinkSpec
    host: HostSpec
    name: str = ""
    """Free-form label for reports; empty means unnamed."""
    cluster: ClusterSpec = SINGLE

    def __post_init__(self):
        for part, cls in (("device", DeviceSpec), ("link", LinkSpec), ("host", HostSpec), ("cluster", ClusterSpec)):
            v = getattr(self, part)
            if not isinstance(v, cls):
                raise HorizonError(f"hardware {part}={v!r} must be a {cls.__name__}")
        if not isinstance(self.name, str):
            raise HorizonError(f"hardware name={self.name!r} must be a string")

    @property
    def device_bytes_usable(self) -> int:
        """Device bytes tensors may use: hbm_GiB - reserved_GiB."""
        return int((self.device.hbm_GiB - self.device.reserved_GiB) * GiB)

    @property
    def disk_bytes_usable(self) -> int:
        """Local disk bytes the disk tier may fill (0: none)."""
        return int(self.host.disk_GiB * GiB)

    @property
    def deepspeed_adam_Gparams_per_s(self) -> float:
        """The rate the ZeRO-3 peer's DeepSpeedCPUAdam runs at: the host's own figure for it,
        else its AdamW rate."""
        return self.host.deepspeed_adam_Gparams_per_s or self.host.adam_Gparams_per_s

    @property
    def host_bytes_usable(self) -> int:
        """Host bytes the trainer may use (its own runtime overhead included): ram_GiB -
        os_reserved_GiB."""
        return int((self.host.ram_GiB - self.host.os_reserved_GiB) * GiB)

    def to_dict(self) -> dict:
        return asdict(self)
