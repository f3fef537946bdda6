"""`horizon train`'s default compute dtype for the device it runs on.

bf16 on a GPU, and on CPUs with bf16 matrix instructions (x86 avx512_bf16 or amx_bf16, Arm
bf16). Elsewhere fp32: without them PyTorch's CPU bf16 GEMM falls back to a slow path (57x
slower than fp32 on an AMD EPYC with AVX2 only, torch 2.13: a 512x688x256 product at 1.26
against 71.7 GFLOP/s on one thread; a bf16 default made the built-in demo train at 63
tokens/s). The CPU backend now takes those GEMMs (and the attention backward) through fp32
instead (bf16_gemm.py), but a bf16 step there still widens every operand and is slower than
fp32's, so fp32 stays the default (benchmarks/bf16_gemm.py --train compares the two). The
choice follows the CPU's flags, not a timing, so the same machine always trains with the same
numerics.
"""
from horizon_exec.procfs import cpu_flags

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_has_bf16_matmul(flags_line: str | None = None) -> bool:
    words = set((flags_line if flags_line is not None else cpu_flags()).split())
    return any(f in words for f in BF16_FLAGS)


def default_compute_dtype(device: str, flags_line: str | None = None, master_dtype: str = "fp32") -> tuple[str, str]:
    """(dtype, why): why is '' when nothing needs saying (bf16 where bf16 is fast, or where the
    policy needs it: a split master's high half is the bf16 working copy)."""
    if master_dtype == "split" or not device.startswith("cpu") or cpu_has_bf16_matmul(flags_line):
        return "bf16", ""
    return "fp32", ("this CPU has no bf16 matrix instructions (avx512_bf16, amx_bf16), where a bf16 step "
                    "widens its GEMMs' operands to fp32 and runs slower than fp32; --compute-dtype bf16 to use it anyway")
