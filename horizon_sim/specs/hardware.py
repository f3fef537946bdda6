"""HardwareSpec: the machine a plan runs on, as three separate parts (Calculon style):
the device (memory, peak FLOP/s, memory bandwidth), the link between host and device
(achieved copy bandwidth and latency) and the host (RAM, DRAM bandwidth, CPU optimizer rate).
Units are in the field names: GiB = 2**30 bytes, GB/s = 1e9 bytes/s, TFLOPs = 1e12 FLOP/s.
Presets live in hardware_presets.py; TOML files are read and written by hardware_io.py."""
import math
from dataclasses import dataclass, asdict

from horizon_sim.errors import HorizonError
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
    object.__setattr__(spec, field, float(v))


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
    launch_overhead_us: float = 8.0
    """Fixed cost of one schedule op on the device (the several kernel launches of one layer
    op and the gaps between them), microseconds. An estimate; calibrate measures it."""

    def __post_init__(self):
        _check_name("device", self.name)
        for f in ("hbm_GiB", "bf16_TFLOPs", "fp32_TFLOPs", "hbm_GBps"):
            _check_number(self, "device", f)
        _check_name("device default_link", self.default_link)
        _check_number(self, "device", "matmul_efficiency", high=1.0)
        _check_number(self, "device", "reserved_GiB", low_ok=True)
        _check_number(self, "device", "launch_overhead_us", low_ok=True)
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

    def __post_init__(self):
        _check_name("link", self.name)
        for f in ("h2d_GBps", "d2h_GBps", "pageable_GBps"):
            _check_number(self, "link", f)
        _check_number(self, "link", "latency_us", low_ok=True)

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
    """Achievable STREAM-like DRAM bandwidth, 1e9 bytes/s, shared by DMA copies and the CPU
    optimizer."""
    cores: int
    """Physical CPU cores available to the trainer."""
    adam_Gparams_per_s: float
    """Fused CPU AdamW rate with all cores when not DRAM-bound, 1e9 parameters/s."""
    os_reserved_GiB: float = 8.0
    """RAM the OS, a minimum page cache and other processes keep."""
    runtime_overhead_GiB: float = 4.0
    """Resident memory of the training process before any model tensor: Python, torch,
    CUDA libraries."""

    def __post_init__(self):
        _check_name("host", self.name)
        for f in ("ram_GiB", "dram_GBps", "adam_Gparams_per_s"):
            _check_number(self, "host", f)
        for f in ("os_reserved_GiB", "runtime_overhead_GiB"):
            _check_number(self, "host", f, low_ok=True)
        if not isinstance(self.cores, int) or isinstance(self.cores, bool) or self.cores <= 0:
            raise HorizonError(f"host cores={self.cores!r} must be a positive integer")
        if self.os_reserved_GiB >= self.ram_GiB:
            raise HorizonError(f"host ram_GiB={self.ram_GiB:g} must be more than "
                               f"os_reserved_GiB={self.os_reserved_GiB:g}")


@dataclass(kw_only=True, frozen=True, slots=True)
class HardwareSpec:
    """A whole single-device machine: device + link + host."""

    device: DeviceSpec
    link: LinkSpec
    host: HostSpec
    name: str = ""
    """Free-form label for reports; empty means unnamed."""

    def __post_init__(self):
        for part, cls in (("device", DeviceSpec), ("link", LinkSpec), ("host", HostSpec)):
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
    def host_bytes_usable(self) -> int:
        """Host bytes the trainer may use (its own runtime overhead included): ram_GiB -
        os_reserved_GiB."""
        return int((self.host.ram_GiB - self.host.os_reserved_GiB) * GiB)

    def to_dict(self) -> dict:
        return asdict(self)
