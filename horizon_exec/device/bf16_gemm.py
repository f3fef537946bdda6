"""bf16 matrix products (and the attention backward) through fp32 on CPUs without bf16 matrix
instructions.

Without avx512_bf16 or amx_bf16 (compute_dtype.py), PyTorch's CPU bf16 GEMM falls back to a
scalar loop, tens of times slower than fp32: a bf16 run and calibrate's bf16 rates crawled on
such CPUs. A bf16 GEMM on a GPU, or with those instructions, takes bf16 operands, accumulates in
fp32 and rounds its result to bf16 once. Widening the operands to fp32 (exact), an fp32 GEMM
and one rounding give that result too, at fp32's speed. While acquired (by a bf16 CPU backend,
or a bf16 measurement: scope()), aten's mm, addmm, bmm and baddbmm do so on bf16 CPU tensors,
process-wide: their CPU kernels are replaced (torch.library). Results differ from PyTorch's
only in summation order (tests/test_bf16_gemm.py). Autograd still saves the bf16 operands (the
widening is inside the kernel, below autograd), so what a step keeps is what the planner
models; the fp32 copies live only while a product runs. Other dtypes go to kernels not replaced
here (the ops' out= forms; mm's through addmm's, as ATen's own mm does), so nothing recurses.

The CPU flash attention's bf16 backward makes the same scalar GEMM calls inside its kernel
(about 2-3 GFLOP/s on an AVX2 CPU against fp32's 18-27 at the same shapes): its bf16 inputs are
widened, the fp32 kernel runs, and the three gradients are rounded once, as a bf16 flash kernel
accumulates in fp32 and rounds its outputs. Having no fp32 twin op to route through, that one is
replaced one dispatch key above the CPU kernel (BackendSelect) and calls the CPU kernel below
itself; the executor's memory tracker (a dispatch mode, above both) still sees one bf16 op. The
forward stays torch's: its bf16 kernel runs at fp32's speed there.
"""
import functools
import threading
import warnings
from contextlib import contextmanager

import torch

from horizon_exec.device.compute_dtype import cpu_has_bf16_matmul

_lock = threading.Lock()
_lib: "torch.library.Library | None" = None
_users = 0


def _fresh(shape, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=like.device)


def _bf16(*ts) -> bool:
    """Every operand bf16: the products this module computes through fp32 (any other mix is
    left to the kernels below, which accept or refuse it as PyTorch's do)."""
    return all(t.dtype == torch.bfloat16 for t in ts)


def _product(a, b, out):
    """a @ b into `out` through addmm.out with beta 0, which is how ATen's own mm computes
    (mm_out_cpu calls the addmm kernel with beta 0): not through mm or mm.out, whose CPU
    kernels are the ones replaced here."""
    return torch.ops.aten.addmm.out(out, a, b, beta=0, alpha=1, out=out)


def _mm(a, b):
    shape = (a.shape[0], b.shape[1])
    if _bf16(a, b):
        return _product(a.float(), b.float(), _fresh(shape, a, torch.float32)).to(torch.bfloat16)
    return _product(a, b, _fresh(shape, a, torch.result_type(a, b)))


def _mm_out(a, b, *, out):
    shape = (a.shape[0], b.shape[1])
    if tuple(out.shape) != shape:
        out.resize_(shape)
    if _bf16(a, b, out):
        return out.copy_(_product(a.float(), b.float(), _fresh(shape, a, torch.float32)))
    return _product(a, b, out)


def _bmm(a, b):
    shape = (a.shape[0], a.shape[1], b.shape[2])
    if _bf16(a, b):
        return torch.ops.aten.bmm.out(a.float(), b.float(), out=_fresh(shape, a, torch.float32)).to(torch.bfloat16)
    return torch.ops.aten.bmm.out(a, b, out=_fresh(shape, a, torch.result_type(a, b)))


def _add_product(op, shape, c, a, b, beta, alpha):
    """op.out(c, a, b) (addmm's or baddbmm's: beta c + alpha a b) into a fresh tensor of `shape`;
    all-bf16 operands widened and the result rounded once."""
    if _bf16(c, a, b):
        return op(c.float(), a.float(), b.float(), beta=beta, alpha=alpha,
                  out=_fresh(shape, a, torch.float32)).to(torch.bfloat16)
    return op(c, a, b, beta=beta, alpha=alpha, out=_fresh(shape, a, a.dtype))


def _addmm(c, a, b, *, beta=1, alpha=1):
    return _add_product(torch.ops.aten.addmm.out, (a.shape[0], b.shape[1]), c, a, b, beta, alpha)


def _baddbmm(c, a, b, *, beta=1, alpha=1):
    return _add_product(torch.ops.aten.baddbmm.out, (a.shape[0], a.shape[1], b.shape[2]), c, a, b, beta, alpha)


KERNELS = {"mm": _mm, "mm.out": _mm_out, "bmm": _bmm, "addmm": _addmm, "baddbmm": _baddbmm}
"""aten op -> its replacement CPU kernel."""

_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_BELOW_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)


def _flash_backward(keyset, grad_out, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    """The CPU flash attention's backward (its schema), at BackendSelect: bf16 inputs widened
    for the CPU kernel below, its gradients rounded to bf16 once; any other dtype passes as is."""
    ks = keyset & _BELOW_BACKEND_SELECT
    if not _bf16(grad_out, q, k, v, out):
        return _FLASH_BWD.redispatch(ks, grad_out, q, k, v, out, lse, dropout_p, is_causal,
                                     attn_mask=attn_mask, scale=scale)
    if attn_mask is not None and attn_mask.dtype == torch.bfloat16:  # an additive mask (a bool one stays)
        attn_mask = attn_mask.float()
    grads = _FLASH_BWD.redispatch(ks, grad_out.float(), q.float(), k.float(), v.float(), out.float(), lse,
                                  dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    return tuple(g.to(torch.bfloat16) for g in grads)


KEYSET_KERNELS = {"_scaled_dot_product_flash_attention_for_cpu_backward": _flash_backward}
"""aten op -> its replacement at BackendSelect (called with the dispatch key set)."""


def needed(compute_dtype, device="cpu", flags_line: str | None = None) -> bool:
    """Whether bf16 GEMMs (and the attention backward) on `device` go through fp32: a bf16 CPU
    computation ('bf16' or torch.bfloat16) on a CPU without bf16 matrix instructions."""
    bf16 = compute_dtype in ("bf16", torch.bfloat16)
    native = _native_bf16() if flags_line is None else cpu_has_bf16_matmul(flags_line)
    return bf16 and str(device).startswith("cpu") and not native


@functools.cache
def _native_bf16() -> bool:
    return cpu_has_bf16_matmul()  # read once: a scope() per measured call must not read /proc


def acquire() -> None:
    """Route bf16 CPU GEMMs and attention backwards through fp32 in this process until the
    matching release(). Counted:
    PyTorch's kernels come back when the last user releases, because the replacements cost fp32
    GEMMs a Python call (~20 us), which an fp32 run or measurement must not pay."""
    global _lib, _users
    with _lock:
        if _users == 0:
            lib = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point
                warnings.simplefilter("ignore")
                for name, fn in KERNELS.items():
                    lib.impl(name, fn, "CPU")
                for name, fn in KEYSET_KERNELS.items():
                    lib.impl(name, fn, "BackendSelect", with_keyset=True)
            _lib = lib
        _users += 1


def release() -> None:
    global _lib, _users
    with _lock:
        if _users == 0:
            raise RuntimeError("bf16_gemm.release() without an acquire()")
        _users -= 1
        if _users == 0:
            _lib._destroy()
            _lib = None


def installed() -> bool:
    return _lib is not None


@contextmanager
def scope(compute_dtype, device="cpu"):
    """with scope("bf16"): ... : bf16 GEMMs through fp32 inside where needed() says so."""
    use = needed(compute_dtype, device)
    if use:
        acquire()
    try:
        yield use
    finally:
        if use:
            release()
