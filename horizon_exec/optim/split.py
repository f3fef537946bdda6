"""The split master: the exact fp32 master held as two 16-bit halves.

hi is the bf16 nearest the master (ties away from zero) and *is* the working copy the loads
stream; lo is the master's low 16 bits, as a signed number, so (hi << 16) + lo is the master's
bit pattern exactly. An exact fp32 master plus its bf16 working copy then takes 4 bytes per
parameter instead of 6, and the optimizer moves 26 bytes per parameter instead of 28. The
rounding, why it is not .to(bfloat16)'s round-half-even, and what happens to NaN: adamw.c,
"The split master". The conversions are the native kernels' (the optimizer splits inline);
a split master needs them.
"""
import torch

from horizon_exec.errors import ExecError
from horizon_exec.optim import native

LOW_DTYPE = torch.int16
"""The low half's dtype (its bits are the master's low 16)."""


def _kernels():
    k = native.kernels()
    if k is None:
        raise ExecError(f"a split master needs the native kernels; {native.status()}")
    return k


def _check(what: str, t: torch.Tensor, dtype, n: int) -> None:
    if t.dtype != dtype or t.numel() != n or not t.is_contiguous() or t.device.type != "cpu":
        raise ExecError(f"split master: {what} is {tuple(t.shape)} {t.dtype} on {t.device}; "
                        f"needs {n} contiguous CPU elements of {dtype}")


def split_(x: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor) -> None:
    """fp32 x -> hi (bf16) and lo (int16), in place, element for element."""
    n = x.numel()
    _check("x", x, torch.float32, n)
    _check("hi", hi, torch.bfloat16, n)
    _check("lo", lo, LOW_DTYPE, n)
    _kernels()["split"](x.data_ptr(), hi.data_ptr(), lo.data_ptr(), n, torch.get_num_threads())


def join(hi: torch.Tensor, lo: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 master of (hi, lo): into `out` (made when None), which is returned."""
    n = hi.numel()
    out = torch.empty(n, dtype=torch.float32) if out is None else out
    _check("hi", hi, torch.bfloat16, n)
    _check("lo", lo, LOW_DTYPE, n)
    _check("out", out, torch.float32, n)
    _kernels()["join"](hi.data_ptr(), lo.data_ptr(), out.data_ptr(), n, torch.get_num_threads())
    return out
