"""The range each number of a hardware file may take (HardwareSpec's fields, their tables' cells
and the cluster's rates), checked when a spec is built.

Finite is not enough: `hbm_GiB = 1e300` is a finite float, but its bytes (x 2**30) overflow
to inf and the planner died in int() with an OverflowError; a rate of 1e-300 makes every time
infinite. The bounds are many orders of magnitude beyond any machine (the largest device today
has under 0.2 TiB of HBM and under 5 PFLOP/s dense, a host under 64 TiB of RAM) and far below
what the arithmetic of a step can overflow: a real file is never refused, a typo or a fuzzed
value is refused by name. They are this wide because the executor's admission and the tests
build "unbounded" machines from them (2**30 GiB of memory, a 1e9 GB/s free network).

Each entry: (smallest, largest), inclusive. The smallest matters for rates (RATE_MIN); memories
and times may be as small as their own checks allow (> 0, or >= 0).
"""

RATE_MIN = 1e-6
"""A rate (TFLOP/s, GB/s, G params/s) below a millionth of its unit is a typo: a step would
take years."""

DEVICE = {
    "hbm_GiB": (0.0, 1 << 50),
    "bf16_TFLOPs": (RATE_MIN, 1e12),
    "fp32_TFLOPs": (RATE_MIN, 1e12),
    "hbm_GBps": (RATE_MIN, 1e12),
    "matmul_efficiency": (RATE_MIN, 1.0),
    "reserved_GiB": (0.0, 1 << 50),
    "library_workspace_MiB": (0.0, 1 << 40),
    "launch_overhead_us": (0.0, 1e9),         # 1000 s
    "elementwise_GBps": (0.0, 1e12),
    "reduce_GBps": (0.0, 1e9),
    "loss_ns_per_logit": (0.0, 1e9),
    "fused_loss_ns_per_logit": (0.0, 1e9),
}
LINK = {
    "h2d_GBps": (RATE_MIN, 1e12),
    "d2h_GBps": (RATE_MIN, 1e12),
    "pageable_GBps": (RATE_MIN, 1e12),
    "latency_us": (0.0, 1e9),
    "busy_latency_us": (0.0, 1e9),
}
HOST = {
    "ram_GiB": (0.0, 1 << 50),
    "dram_GBps": (RATE_MIN, 1e12),
    "adam_Gparams_per_s": (RATE_MIN, 1e12),
    "cores": (1, 1 << 20),
    "os_reserved_GiB": (0.0, 1 << 50),
    "runtime_overhead_GiB": (0.0, 1 << 50),
    "lane_cores": (0.0, 1 << 24),
    "thread_GBps": (0.0, 1e12),
    "op_latency_us": (0.0, 1e9),
    "busy_latency_us": (0.0, 1e9),
    "disk_GiB": (0.0, 1 << 50),
    "disk_read_GBps": (0.0, 1e12),
    "disk_write_GBps": (0.0, 1e12),
    "disk_latency_us": (0.0, 1e9),
    "compute_contention": (0.0, 1e3),
    "dram_channels": (0, 1 << 16),
    "dram_MTps": (0.0, 1e6),
}
CLUSTER = {
    "fabric_GBps": (0.0, 1e12),
    "fabric_latency_us": (0.0, 1e9),
    "net_GBps": (0.0, 1e12),
    "net_latency_us": (0.0, 1e9),
}
PARTS = {"device": DEVICE, "link": LINK, "host": HOST, "cluster": CLUSTER}

TABLE_CELLS = {
    "M": (1, 1 << 40), "N": (1, 1 << 40), "K": (1, 1 << 40),   # GEMM sizes
    "SEQ": (1, 1 << 40), "HEAD_DIM": (1, 1 << 16),
    "TFLOPS": (RATE_MIN, 1e12), "FWD": (RATE_MIN, 1e12), "BWD": (RATE_MIN, 1e12),
    "US": (RATE_MIN, 1e9),                                    # a fixed cost per op: up to 1000 s
    "NS": (RATE_MIN, 1e9),                                    # a time per parameter (dequant_ns_per_param)
    "THREADS": (1, 1 << 20), "ALONE": (RATE_MIN, 1e6), "SHARED": (RATE_MIN, 1e6),  # thread_speed
    "GEMM": (RATE_MIN, 1e6), "ATTENTION": (RATE_MIN, 1e6), "ELEMENTWISE": (RATE_MIN, 1e6),  # thread_kernel_speed
}
"""The numeric columns of the measured tables (gemm_TFLOPs, attention_TFLOPs, op_overhead_us)."""


def bounds(part: str, field: str) -> tuple[float, float] | None:
    """(smallest, largest) of `field` in the [part] table, None when it has no range here."""
    return PARTS.get(part, {}).get(field)


def out_of_range(v: float, lo: float, hi: float) -> str:
    """'' when lo <= v <= hi, else what is allowed ('must be from 0.000977 to 1.04858e+06')."""
    return "" if lo <= v <= hi else f"must be from {lo:g} to {hi:g}"
