"""The native one-pass AdamW (horizon_exec/optim/native/adamw.c) against torch's fused AdamW.

The oracle is torch._fused_adamw_ run on the widened (fp32) gradient multiplied by the clip
coefficient (what clip_grad_norm_ does before the step), with fp32 moments; for
bf16 moments, the same step on the moments widened to fp32, then rounded back to bf16. The
native kernel follows the order of operations of torch's vectorized loop, so the results are
equal up to a few elements of torch's scalar tail (the last n % 16, within 1 ulp there): the
tests allow 1 ulp per element and count. The bf16 working copy must equal torch's own
rounding of the updated master bit for bit.
"""
import contextlib
import dataclasses
import threading

import pytest
import torch

from horizon_exec.optim import native
from horizon_exec.errors import ExecError
from horizon_exec.optim.adamw import AdamW
from horizon_sim.errors import HorizonError

LR, WD, BETAS, EPS = 1e-3, 0.1, (0.9, 0.95), 1e-8
SIZES = [1, 15, 2048, 2049, 100_003]


@pytest.fixture(autouse=True)
def _need_native():
    if native.adamw() is None:
        pytest.skip(native.status())


@pytest.fixture(scope="module")
def _generic_build(tmp_path_factory):
    """adamw.c built without -march=native: the portable code paths (on an AVX512-BF16 CPU
    the native build rounds the working copy with that instruction, this one does not)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HORIZON_CACHE_DIR", str(tmp_path_factory.mktemp("generic")))
    mp.setattr(native, "FLAG_SETS", [native.BASE_FLAGS])
    try:
        fn, status = native.load()
    finally:
        mp.undo()
    if fn is None and "self-test" in status:
        pytest.fail(status)  # it built, and computes wrong
    if fn is None:
        pytest.skip(status)  # no compiler here
    return fn, status


@pytest.fixture(params=["native ISA", "generic ISA"])
def build(request):
    """Runs a test once with each build of the kernel that AdamW(kernel='native') calls."""
    chosen = native.use(*request.getfixturevalue("_generic_build")) if request.param == "generic ISA" \
        else contextlib.nullcontext()
    with chosen:
        status = native.status()
        if request.param not in status:
            # A -march=native build dying of SIGILL met a CPU that does not run what it reports:
            # this machine's problem. Any other rejection (wrong numbers, a segfault) is the kernel's.
            rejections = [r for r in status.split("; ") if "-march=native" in r and "build rejected" in r]
            if any("SIGILL" not in r for r in rejections):
                pytest.fail(status)
            pytest.skip(status)
        yield request.param


def _torch_step(p, g32, m, v, step, coef):
    """clip_grad_norm_'s multiply, then torch's fused kernel: one AdamW step, in place (step:
    fp32 scalar, incremented)."""
    step += 1
    torch._fused_adamw_([p], [g32 * coef], [m], [v], [], [step], lr=LR, beta1=BETAS[0], beta2=BETAS[1],
                        weight_decay=WD, eps=EPS, amsgrad=False, maximize=False)


def _close_ulp(a, b):
    """Every element within 1 ulp of fp32 (relative 2^-23), almost all equal."""
    diff = (a - b).abs()
    assert bool((diff <= b.abs() * 2.0 ** -23 + 1e-38).all()), f"max diff {diff.max().item()}"
    assert int((a != b).sum()) <= max(16, a.numel() // 1000)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("coef", [1.0, 0.37])
def test_fp32_moments_equal_torch(n, grad_dtype, coef, build):
    gen = torch.Generator().manual_seed(n)
    p = torch.randn(n, generator=gen)
    m, v = torch.zeros(n), torch.zeros(n)
    ref_p, ref_m, ref_v = p.clone(), m.clone(), v.clone()
    wc = torch.empty(n, dtype=torch.bfloat16)
    step, ref_step = torch.zeros(()), torch.zeros(())
    opt = AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, kernel="native")
    for _ in range(3):
        g = (torch.randn(n, generator=gen) * 1e-2).to(grad_dtype)
        opt.step(p, g, m, v, step, coef, working_copy=wc)
        _torch_step(ref_p, g.float(), ref_m, ref_v, ref_step, coef)
    assert step.item() == ref_step.item() == 3
    for ours, ref in ((p, ref_p), (m, ref_m), (v, ref_v)):
        _close_ulp(ours, ref)
    assert torch.equal(wc, p.to(torch.bfloat16))  # torch's rounding, bit for bit


@pytest.mark.parametrize("n", [2049, 100_003])
def test_bf16_moments_are_torch_step_rounded(n, build):
    """bf16 moments: each step is torch's step on the widened moments; the master uses the
    unrounded moments, the stored moments are rounded to nearest even."""
    gen = torch.Generator().manual_seed(1)
    p = torch.randn(n, generator=gen)
    m = (torch.randn(n, generator=gen) * 1e-3).to(torch.bfloat16)
    v = (torch.rand(n, generator=gen) * 1e-5).to(torch.bfloat16)
    wc = torch.empty(n, dtype=torch.bfloat16)
    step = torch.tensor(4.0)  # a run in progress: bias corrections not trivial
    opt = AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for _ in range(3):
        g = (torch.randn(n, generator=gen) * 1e-2).to(torch.bfloat16)
        ref_p, ref_m, ref_v, ref_step = p.clone(), m.float(), v.float(), step.clone()
        _torch_step(ref_p, g.float(), ref_m, ref_v, ref_step, 0.5)
        opt.step(p, g, m, v, step, 0.5, working_copy=wc)
        _close_ulp(p, ref_p)
        _close_ulp(m.float(), ref_m.to(torch.bfloat16).float())
        _close_ulp(v.float(), ref_v.to(torch.bfloat16).float())
        assert m.dtype == v.dtype == torch.bfloat16
        assert torch.equal(wc, p.to(torch.bfloat16))


def test_working_copy_rounds_like_torch(build):
    """lr = 0 leaves the master as it is, so the working copy is the bf16 of chosen values:
    ties (to even, both ways), infinities, NaN, the largest finite float, and subnormals (the
    AVX512-BF16 instruction flushes them: vectors holding one take the scalar rounding). First
    without subnormals, so the vector conversion meets the other values, then with them."""
    normal = [0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F800000, 0xFF800000,
              0x7FC00000, 0x7F800001, 0x7F7FFFFF, 0x00000000, 0x80000000]
    subnormal = [0x00000001, 0x80008000, 0x00018000, 0x807FFFFF]  # the last two round to non-zero
    bits = [torch.tensor(b, dtype=torch.int64).to(torch.int32).repeat(200) for b in (normal, normal + subnormal)]
    p = torch.cat(bits).view(torch.float32)  # long enough for the vectorized loops
    n = p.numel()
    wc = torch.empty(n, dtype=torch.bfloat16)
    AdamW(lr=0.0, kernel="native").step(p.clone(), torch.zeros(n), torch.zeros(n), torch.zeros(n),
                                        torch.zeros(()), working_copy=wc)
    ref = p.to(torch.bfloat16)
    nan = ref.isnan()  # torch itself writes NaN as 0x7FC0 (scalar) or 0xFFFF (vectorized)
    assert torch.equal(wc.isnan(), nan) and int(nan.sum()) == 2 * 2 * 200
    assert torch.equal(wc.view(torch.int16)[~nan], ref.view(torch.int16)[~nan])



@pytest.mark.parametrize("offset", [1, 31])
def test_buffers_off_cache_line_boundaries(offset, build):
    """Views that start mid-line (a user's slices): the working copy's streaming stores need
    64-byte alignment, so the elements before the first boundary take the scalar path; the
    result is the same as on aligned buffers."""
    n = 100_003
    gen = torch.Generator().manual_seed(4)

    def at(t):  # the same values, starting `offset` elements past an aligned start
        out = torch.empty(t.numel() + offset, dtype=t.dtype)[offset:].copy_(t)
        assert out.data_ptr() % 64 != 0
        return out

    p, g = torch.randn(n, generator=gen), (torch.randn(n, generator=gen) * 1e-2).to(torch.bfloat16)
    state = {"aligned": [p.clone(), g.clone(), torch.zeros(n), torch.zeros(n)],
             "shifted": [at(p), at(g), at(torch.zeros(n)), at(torch.zeros(n))]}
    wcs = {"aligned": torch.empty(n, dtype=torch.bfloat16), "shifted": at(torch.zeros(n, dtype=torch.bfloat16))}
    for k, (p_, g_, m_, v_) in state.items():
        AdamW(lr=LR, weight_decay=WD, kernel="native").step(p_, g_, m_, v_, torch.zeros(()), 0.5,
                                                             working_copy=wcs[k])
    assert all(torch.equal(a, b) for a, b in zip(state["aligned"], state["shifted"]))
    assert torch.equal(wcs["shifted"], state["shifted"][0].to(torch.bfloat16))

def test_threads_do_not_change_the_result():
    """The update is elementwise: splitting it over OpenMP threads gives the same bits."""
    n = 300_007
    gen = torch.Generator().manual_seed(2)
    base = [torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)]
    g = (torch.randn(n, generator=gen) * 1e-2).to(torch.bfloat16)
    out = {}

    def run(threads):
        torch.set_num_threads(threads)  # the kernel takes the calling thread's count
        p, m, v = (t.clone() for t in base)
        wc = torch.empty(n, dtype=torch.bfloat16)
        AdamW(lr=LR, weight_decay=WD, kernel="native").step(p, g, m, v, torch.zeros(()), 0.5, working_copy=wc)
        out[threads] = (p, m, v, wc)

    for threads in (1, 2):
        t = threading.Thread(target=run, args=(threads,))
        t.start()
        t.join()
    assert all(torch.equal(a, b) for a, b in zip(out[1], out[2]))


def test_torch_path_gives_the_same_update():
    """The fallback (chunked widen + torch's kernel + refresh) and the native kernel agree.
    The fallback clips by dividing by 1/coef (torch's grad_scale), the native kernel multiplies
    by coef (as clip_grad_norm_): the gradients differ by up to an ulp, so more elements differ,
    by a few ulps of the tensor's scale (more, relatively, where a moment nearly cancels)."""
    n = (1 << 19) + 123  # more than one of the torch path's chunks
    gen = torch.Generator().manual_seed(3)
    p0 = torch.randn(n, generator=gen)
    g = (torch.randn(n, generator=gen) * 1e-2).to(torch.bfloat16)
    res = {}
    for kernel in ("native", "torch"):
        p, m, v, wc = p0.clone(), torch.zeros(n), torch.zeros(n), torch.empty(n, dtype=torch.bfloat16)
        opt, step = AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, kernel=kernel), torch.zeros(())
        for _ in range(2):
            opt.step(p, g, m, v, step, 0.37, working_copy=wc)
        res[kernel] = (p, m, v, wc)
    for a, b in zip(res["native"][:3], res["torch"][:3]):
        torch.testing.assert_close(a, b, rtol=4 * 2.0 ** -23, atol=4 * 2.0 ** -23 * b.abs().max().item())
    assert int((res["native"][3] != res["torch"][3]).sum()) <= n // 1000  # the working copies


def test_bad_buffers_are_refused_by_name():
    opt = AdamW(kernel="native")
    p, m, v = torch.zeros(8), torch.zeros(8), torch.zeros(8)
    with pytest.raises(ExecError, match="grad is \\(7,\\)"):
        opt.step(p, torch.zeros(7), m, v, torch.zeros(()))
    with pytest.raises(ExecError, match="working_copy is .*float16"):
        opt.step(p, torch.zeros(8), m, v, torch.zeros(()), working_copy=torch.zeros(8, dtype=torch.float16))
    with pytest.raises(ExecError, match="exp_avg_sq"):
        opt.step(p, torch.zeros(8), m, v.to(torch.bfloat16), torch.zeros(()))  # moments of two dtypes
    st = torch.zeros(())
    with pytest.raises(ExecError, match="param is"):  # a strided master is refused...
        opt.step(torch.zeros(16)[::2], torch.zeros(8), m, v, st)
    assert st.item() == 0  # ...before the step counter moves
    with pytest.raises(HorizonError, match="kernel='fast'"):
        AdamW(kernel="fast")


@native.use(None, "unavailable: building adamw.c with 'cc' failed: no cc")
def test_without_the_kernel():
    """No compiler here: 'auto' falls back to torch for fp32 moments, bf16 moments and a
    forced 'native' are refused with the reason."""
    opt = AdamW()
    assert not opt.uses_native(torch.float32, torch.float32)
    p, m, v = torch.ones(4), torch.zeros(4), torch.zeros(4)
    opt.step(p, torch.ones(4, dtype=torch.bfloat16), m, v, torch.zeros(()))  # torch path runs
    assert bool((p < 1).all())
    with pytest.raises(ExecError, match="moments in bf16 with the master in fp32 need the native AdamW kernel.*no cc"):
        opt.uses_native(torch.float32, torch.bfloat16)
    with pytest.raises(ExecError, match="no cc"):
        dataclasses.replace(opt, kernel="native").uses_native(torch.float32, torch.float32)


def test_build_failure_is_reported_not_raised(monkeypatch, tmp_path):
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    fn, status = native.load()
    assert fn is None and "no-such-compiler" in status and "unavailable" in status
    monkeypatch.setenv("HORIZON_NATIVE", "0")
    assert native.load() == (None, "off (HORIZON_NATIVE=0)")


def test_build_is_cached(monkeypatch, tmp_path):
    """Built once per source/flags/compiler/CPU: the second load compiles nothing."""
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(tmp_path))
    fn, status = native.load()
    if fn is None:
        pytest.skip(status)
    (so,) = tmp_path.glob("native/kernels-*.so")
    before = so.stat().st_mtime_ns
    fn2, _ = native.load()
    assert fn2 is not None and so.stat().st_mtime_ns == before
    # no temporary left behind; the checksum recorded at build time beside it, and the verdict
    # of its self-test in a child (issue 30: a forged object is never mapped by the trainer)
    assert sorted(p.name for p in tmp_path.glob("native/*")) == [so.with_suffix(".sha256").name, so.name,
                                                                 so.with_suffix(".verified").name]


def test_unwritable_cache_falls_back_to_a_temp_folder(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(blocker))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(native.tempfile, "tempdir", None)  # re-read TMPDIR
    fn, status = native.load()
    assert fn is not None and str(tmp_path / "tmp" / "horizon-native-") in status


TRAP_H = """#include <math.h>
#include <signal.h>
static inline float horizon_trap(float x) { raise(SIGILL); return x; }
#define sqrtf horizon_trap
"""


@pytest.mark.parametrize("broken,why", [
    (["-include", "TRAP_H"], "self-test died with SIGILL"),                    # a CPU lying about its ISA
    (["-Dsqrtf=fabsf"], "self-test failed: grad fp32, moments fp32: param"),  # a miscompile
])
def test_a_build_failing_its_self_test_is_rejected_and_remembered(monkeypatch, tmp_path, broken, why):
    """A build that dies or computes wrong in its self-test (a child process) is not cached
    or loaded: the next flag set is used, the status says why, and the rejection is
    remembered so the next start does not rebuild it."""
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(tmp_path))
    (tmp_path / "trap.h").write_text(TRAP_H)
    broken = [str(tmp_path / "trap.h") if f == "TRAP_H" else f for f in broken]
    monkeypatch.setattr(native, "FLAG_SETS", [native.BASE_FLAGS + broken, native.BASE_FLAGS])
    fn, status = native.load()
    if fn is None and "rejected" not in status:
        pytest.skip(status)  # no compiler here
    assert fn is not None and "generic ISA" in status and why in status, status
    (mark,) = tmp_path.glob("native/*.rejected")
    assert len(list(tmp_path.glob("native/*.so"))) == 1  # only the good build is cached
    before = mark.stat().st_mtime_ns
    fn2, status2 = native.load()
    assert fn2 is not None and why in status2 and mark.stat().st_mtime_ns == before
