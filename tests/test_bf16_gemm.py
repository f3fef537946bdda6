"""bf16 GEMMs and the attention backward through fp32 on CPUs without bf16 matrix instructions
(device/bf16_gemm.py): the products PyTorch's own bf16 kernels give (fp32-accumulated, rounded
once), attention gradients no further from exact than PyTorch's, every other dtype untouched,
autograd and the memory tracker seeing what they saw, and PyTorch's kernels back after the last
release()."""
import contextlib

import pytest
import torch

from horizon_exec.device import bf16_gemm

BF = torch.bfloat16


@pytest.fixture
def kernels(monkeypatch):
    """kernels(ours): PyTorch's bf16 GEMM kernels (False) or bf16_gemm's (True) for the test; any
    holder's from before (a backend another test left open) put back after."""
    held = bf16_gemm._users
    for _ in range(held):
        bf16_gemm.release()

    def use(ours: bool):
        if ours != bf16_gemm.installed():
            bf16_gemm.acquire() if ours else bf16_gemm.release()
    yield use
    use(False)
    for _ in range(held):
        bf16_gemm.acquire()


def _products(dtype, compute=None):
    """The products, operands held in `dtype` and multiplied in `compute` (default: dtype)."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype).to(compute or dtype)  # noqa: E731
    a, b, bias = r(96, 200), r(200, 72), r(72)
    A, B, C = r(3, 40, 200), r(3, 200, 24), r(3, 40, 24)
    def mm_out():   # the out= form, as the head's backward writes into its slice
        out = torch.full((a.shape[0] + 4, b.shape[1]), float("nan")).to(a.dtype)
        torch.mm(a, b, out=out[2:-2])
        return out[2:-2]
    return lambda: [a @ b, a @ b.t().contiguous().t(), mm_out(), torch.addmm(bias, a, b, beta=0.5, alpha=2.0),
                    torch.bmm(A, B), torch.baddbmm(C, A, B, beta=0.5, alpha=2.0),
                    torch.nn.functional.linear(A, b.t().contiguous(), bias)]


def test_bf16_products_are_pytorchs_to_summation_order(kernels):
    products = _products(BF)
    kernels(False)
    native = products()
    kernels(True)
    ours = products()
    exact = _products(BF, torch.float64)()  # the same bf16 operands, multiplied in fp64
    for n, o, e in zip(native, ours, exact):
        assert o.dtype == BF and o.shape == n.shape
        # rounded once from an fp32 sum: within one bf16 rounding (2^-8 relative) of the exact
        # product, as PyTorch's own kernel is (the margin: fp32's sum of ~200 terms)
        tol = 2 ** -8 * e.abs() + 1e-3
        assert ((o.double() - e).abs() <= tol).all()
        assert ((n.double() - e).abs() <= tol).all()
        assert (o != n).float().mean() < 0.01   # where they differ, the summation order did it


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_other_dtypes_take_pytorchs_kernels_bit_for_bit(kernels, dtype):
    products = _products(dtype)
    kernels(False)
    native = products()
    kernels(True)
    for n, o in zip(native, products()):
        assert o.dtype == n.dtype and torch.equal(o, n)


def test_autograd_saves_bf16_and_its_gradients_are_pytorchs(kernels):
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(4, 16, 64, generator=g).to(BF)
    w0, b0 = torch.randn(48, 64, generator=g).to(BF), torch.randn(48, generator=g).to(BF)

    def grads():
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
            y = torch.nn.functional.linear(x, w, b)
            loss = (y.float() ** 2).mean()
        loss.backward()
        return saved, [t.grad for t in (x, w, b)]

    kernels(False)
    saved_native, native = grads()
    kernels(True)
    saved, ours = grads()
    assert saved == saved_native and BF in saved and torch.float32 not in saved[:2]
    for n, o in zip(native, ours):
        assert o.dtype == BF
        torch.testing.assert_close(o.float(), n.float(), rtol=2 ** -6, atol=1e-3)


def _cpu_kernel(op: str) -> str:
    return next(line for line in torch._C._dispatch_dump(op).splitlines() if line.startswith("CPU:"))


def test_the_last_release_puts_pytorchs_kernels_back(kernels):
    kernels(False)
    native = {op: _cpu_kernel(f"aten::{op}") for op in bf16_gemm.KERNELS}
    with bf16_gemm.scope("bf16"), bf16_gemm.scope("bf16"):   # two users, e.g. two backends
        pass
    assert not bf16_gemm.installed()
    kernels(True)
    bf16_gemm.acquire()
    kernels(False)   # one of two users released: still ours
    assert all("bf16_gemm.py" in _cpu_kernel(f"aten::{op}") for op in bf16_gemm.KERNELS)
    bf16_gemm.release()
    assert {op: _cpu_kernel(f"aten::{op}") for op in bf16_gemm.KERNELS} == native
    with pytest.raises(RuntimeError, match="without an acquire"):
        bf16_gemm.release()


@pytest.mark.parametrize("dtype,device,flags,ours", [
    ("bf16", "cpu", "fpu avx2 fma", True), ("fp32", "cpu", "fpu avx2 fma", False),
    ("bf16", "cuda", "fpu avx2 fma", False), ("bf16", "cpu", "avx2 avx512f avx512_bf16", False),
    ("bf16", "cpu", "avx2 amx_bf16", False)])
def test_only_bf16_on_a_cpu_without_bf16_instructions_takes_them(dtype, device, flags, ours):
    assert bf16_gemm.needed(dtype, device, flags) is ours


def test_a_bf16_cpu_backend_holds_them_until_closed(kernels):
    from horizon_exec.device.compute_dtype import cpu_has_bf16_matmul
    from horizon_exec.device.cpu import CpuBackend
    kernels(False)
    b = CpuBackend(compute_dtype="bf16")
    assert b.bf16_gemms_through_fp32 is bf16_gemm.installed() is (not cpu_has_bf16_matmul())
    b.close()
    b.close()
    assert not bf16_gemm.installed()
    CpuBackend(compute_dtype="fp32").close()
    assert not bf16_gemm.installed()


def _attention_grads(dtype, masked: bool, seen: list | None = None):
    """Gradients of q, k, v through the template's SDPA call (grouped kv heads; causal, or under
    a sliding-window bool mask), inputs rounded to bf16 and held in `dtype`; seen: the aten ops
    a dispatch mode (as the executor's memory tracker is one) sees, appended."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from horizon_exec.model.layers import attention_mask

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((str(func), tuple(getattr(a, "dtype", None) for a in args)))
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    B, T, H, KV, hd = 2, 48, 4, 2, 16
    r = lambda *s: torch.randn(*s, generator=g).to(BF).to(dtype)  # noqa: E731
    q, k, v, go = r(B, H, T, hd), r(B, KV, T, hd), r(B, KV, T, hd), r(B, H, T, hd)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = attention_mask(T, 16, None, "cpu") if masked else None
    with Seen() if seen is not None else contextlib.nullcontext():
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        return torch.autograd.grad(o, [q, k, v], go)


@pytest.mark.parametrize("masked", [False, True])
def test_the_attention_backward_is_no_further_from_exact_than_pytorchs(kernels, masked):
    """Against the fp64 gradients of the same bf16 inputs, the backward through fp32 is within
    one bf16 rounding plus what PyTorch's own bf16 kernel is off by beyond that (its error comes
    from the bf16 forward output both read, and its own bf16 intermediates: measured, ours 0-3x
    closer)."""
    exact = _attention_grads(torch.float64, masked)
    kernels(False)
    native = _attention_grads(BF, masked)
    kernels(True)
    ours = _attention_grads(BF, masked)

    def beyond_rounding(x, e):
        return ((x.double() - e).abs() - 2 ** -8 * e.abs()).max().item()
    for n, o, e in zip(native, ours, exact):
        assert o.dtype == BF and o.shape == n.shape
        assert beyond_rounding(o, e) <= beyond_rounding(n, e) + 1e-6
    assert any(not torch.equal(n, o) for n, o in zip(native, ours))  # (another kernel computed them)


def test_the_attention_backward_in_fp32_is_pytorchs_bit_for_bit(kernels):
    kernels(False)
    native = _attention_grads(torch.float32, False)
    kernels(True)
    assert all(torch.equal(n, o) for n, o in zip(native, _attention_grads(torch.float32, False)))


def test_a_dispatch_mode_sees_the_same_bf16_ops_as_with_pytorchs_kernel(kernels):
    """The widened copies and the fp32 kernel run below the memory tracker's dispatch mode: it
    charges the same ops' outputs as it does on a CPU with bf16 instructions."""
    kernels(False)
    native: list = []
    _attention_grads(BF, False, native)
    kernels(True)
    ours: list = []
    _attention_grads(BF, False, ours)
    assert ours == native and any("flash_attention_for_cpu_backward" in f for f, _ in ours)


def _keyset_kernel(op: str) -> str | None:
    return next((line for line in torch._C._dispatch_dump(op).splitlines() if line.startswith("BackendSelect")), None)


def test_the_attention_backward_is_replaced_while_held_and_only_then(kernels):
    kernels(False)
    assert all(_keyset_kernel(f"aten::{op}") is None for op in bf16_gemm.KEYSET_KERNELS)
    kernels(True)
    assert all("bf16_gemm.py" in _keyset_kernel(f"aten::{op}") for op in bf16_gemm.KEYSET_KERNELS)
    kernels(False)
    assert all(_keyset_kernel(f"aten::{op}") is None for op in bf16_gemm.KEYSET_KERNELS)
