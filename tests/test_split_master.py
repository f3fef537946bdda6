"""The split master (horizon_exec/optim/split.py, adamw.c "The split master").

- Exhaustive: every one of the 2^32 fp32 bit patterns splits into (hi, lo) and joins back to
  itself bit for bit (NaN: to a NaN), and hi equals torch's .to(bfloat16) except exactly on
  the ties with an even high half (where ours rounds away from zero: 32,640 patterns).
- AdamW on a split master keeps the master torch's fused AdamW computes on an fp32 master,
  bit for bit over 200 steps, and what the native fp32-master kernel computes for every size.
- A bf16 master (no fp32 master): each step is torch's step on the widened weight, rounded.
"""
import pytest
import torch

from horizon_exec.optim import native
from horizon_exec.optim.adamw import AdamW
from horizon_exec.optim.split import join, split_

LR, WD, BETAS, EPS = 1e-3, 0.1, (0.9, 0.95), 1e-8
CHUNK = 1 << 26  # patterns per pass of the exhaustive test (256 MiB of fp32)
EVEN_TIES = 2 * (0x7F80 // 2)
"""Ties (low half 0x8000) with an even, non-NaN high half: 0x0000..0x7F7E even, both signs."""


@pytest.fixture(autouse=True)
def _need_native():
    if native.kernels() is None:
        pytest.skip(native.status())


def _split(x):
    hi, lo = torch.empty(x.numel(), dtype=torch.bfloat16), torch.empty(x.numel(), dtype=torch.int16)
    split_(x, hi, lo)
    return hi, lo


def test_split_is_exact_and_rounds_to_nearest_over_all_2_32_patterns():
    hi = torch.empty(CHUNK, dtype=torch.bfloat16)
    lo, back = torch.empty(CHUNK, dtype=torch.int16), torch.empty(CHUNK)
    # buffers reused chunk by chunk (fresh 64-256 MiB tensors per chunk cost their page faults)
    ref, ne, no_nan = torch.empty(CHUNK, dtype=torch.bfloat16), torch.empty(CHUNK, dtype=torch.bool), torch.zeros(
        CHUNK, dtype=torch.bool)
    u = torch.arange(-(1 << 31), -(1 << 31) + CHUNK, dtype=torch.int32)  # patterns, chunk by chunk
    differ_total = nans = 0
    for k in range(1 << 32 >> 26):
        if k:
            u += CHUNK
        x = u.view(torch.float32)
        split_(x, hi, lo)
        start = int(u[0])
        # NaN patterns (exponent all ones, mantissa not 0) lie in two chunks only: -8388607..-1
        # and 0x7f800001..0x7fffffff as int32
        has_nan = start <= -1 and start + CHUNK > -8388607 or start + CHUNK > 0x7F800001
        nan = x.isnan() if has_nan else no_nan
        # hi against torch's round-half-even: the positions where they differ are the ties
        # with an even high half (u & 0x1ffff == 0x8000: every 2^17th pattern), none of them NaN
        torch.ne(hi.view(torch.int16), ref.copy_(x).view(torch.int16), out=ne)  # ref: x.to(bfloat16)
        first = (0x8000 - start) % (1 << 17)
        ties = torch.arange(first, CHUNK, 1 << 17)
        ties = ties[~nan[ties]]
        if has_nan:
            differ = (ne & ~nan).nonzero().flatten()
            assert torch.equal(differ, ties), f"chunk {k}: hi differs from .to(bfloat16) off the even ties"
        else:  # the same check without listing the chunk (nonzero costs 4x the rest of the check):
            differ = ties  # they differ at every tie and nowhere else
            assert bool(ne[ties].all()) and int(ne.count_nonzero()) == ties.numel(), \
                f"chunk {k}: hi differs from .to(bfloat16) off the even ties"
        d = hi[differ].float().abs() - x[differ].abs()  # one half-ulp further from zero
        assert bool((d > 0).all())
        differ_total += differ.numel()
        if has_nan:
            nans += int(nan.sum())
            assert bool(hi[nan].isnan().all()), f"chunk {k}: a NaN master's working copy is not NaN"
        join(hi, lo, back)
        if not torch.equal(back.view(torch.int32), u):
            bad = back.view(torch.int32) != u
            assert bool(nan[bad].all()) and bool(back[bad].isnan().all()), f"chunk {k}: a pattern did not round trip"
    assert differ_total == EVEN_TIES == 32640
    assert nans == 2 * (2**23 - 1)  # every NaN pattern was in a chunk checked for them


def test_specials_and_subnormals_round_trip():
    x = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-45, -1e-45, 1e-40, 1.1754942e-38,
                      3.4028235e38, -3.4028235e38, 1.0 + 2.0 ** -8, 65504.0])
    hi, lo = _split(x)
    assert torch.equal(join(hi, lo).view(torch.int32), x.view(torch.int32))
    # round to nearest: the largest floats are nearer bf16's infinity than its largest finite
    assert hi[8].item() == float("inf") and hi[9].item() == float("-inf")
    assert torch.equal(hi[:8], x[:8].to(torch.bfloat16))


def _torch_step(p, g32, m, v, step, coef):
    step += 1
    torch._fused_adamw_([p], [g32 * coef], [m], [v], [], [step], lr=LR, beta1=BETAS[0], beta2=BETAS[1],
                        weight_decay=WD, eps=EPS, amsgrad=False, maximize=False)


def test_split_adamw_keeps_torchs_fp32_master_bit_for_bit_over_200_steps():
    n = 4096  # whole vectors: torch's vectorized loop throughout (its scalar tail has no FMA)
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(n, generator=gen) * 0.02
    hi, lo = _split(ref)
    m, v, rm, rv = torch.zeros(n), torch.zeros(n), torch.zeros(n), torch.zeros(n)
    step, rstep = torch.zeros(()), torch.zeros(())
    opt = AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for s in range(200):
        g = (torch.randn(n, generator=gen) * 1e-2).to(torch.bfloat16)
        coef = 1.0 if s % 3 else 0.6  # clipped on every third step
        opt.step_split(hi, lo, g, m, v, step, coef)
        _torch_step(ref, g.float(), rm, rv, rstep, coef)
        assert torch.equal(join(hi, lo).view(torch.int32), ref.view(torch.int32)), f"step {s + 1}"
    assert torch.equal(m, rm) and torch.equal(v, rv)
    tie = (ref.view(torch.int32) & 0x1FFFF) == 0x8000
    assert torch.equal(hi[~tie], ref[~tie].to(torch.bfloat16))  # the working copy


@pytest.mark.parametrize("n", [1, 15, 2049, 100_003])
@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("states_dtype", [torch.float32, torch.bfloat16])
def test_split_adamw_equals_the_fp32_master_kernel(n, grad_dtype, states_dtype):
    """Every size (the native kernel's scalar tails too), both gradient and moment dtypes,
    two threads: the split master is the fp32 master's kernel, bit for bit."""
    gen = torch.Generator().manual_seed(n)
    p = torch.randn(n, generator=gen)
    hi, lo = _split(p)
    m = (torch.randn(n, generator=gen) * 1e-3).to(states_dtype)
    v = (torch.rand(n, generator=gen) * 1e-5).to(states_dtype)
    m2, v2 = m.clone(), v.clone()
    step, step2 = torch.tensor(5.0), torch.tensor(5.0)
    opt = AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, kernel="native")
    for _ in range(3):
        g = (torch.randn(n, generator=gen) * 1e-2).to(grad_dtype)
        opt.step(p, g, m, v, step, 0.7)
        opt.step_split(hi, lo, g, m2, v2, step2, 0.7)
    assert torch.equal(join(hi, lo).view(torch.int32), p.view(torch.int32))
    assert torch.equal(m, m2) and torch.equal(v, v2) and step.item() == step2.item() == 8


@pytest.mark.parametrize("states_dtype", [torch.float32, torch.bfloat16])
def test_bf16_master_is_torchs_step_rounded(states_dtype):
    """A bf16 master: each step is torch's on the widened weight (and moments), then the
    weight (and moments) rounded to nearest even."""
    n = 4096
    gen = torch.Generator().manual_seed(3)
    p = (torch.randn(n, generator=gen) * 0.02).to(torch.bfloat16)
    m, v = torch.zeros(n, dtype=states_dtype), torch.zeros(n, dtype=states_dtype)
    step = torch.zeros(())
    opt = AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    assert opt.uses_native(torch.bfloat16, states_dtype)
    for _ in range(5):
        g = (torch.randn(n, generator=gen) * 1e-2).to(torch.bfloat16)
        rp, rm, rv, rstep = (t.to(torch.float32, copy=True) for t in (p, m, v, step))
        _torch_step(rp, g.float(), rm, rv, rstep, 1.0)
        opt.step(p, g, m, v, step, 1.0)
        assert torch.equal(p, rp.to(torch.bfloat16))
        assert torch.equal(m, rm.to(states_dtype)) and torch.equal(v, rv.to(states_dtype))


def _kernel(name):
    return native.kernels()[name]


def test_stochastic_rounding_is_exact_in_expectation_over_all_its_draws():
    """For each value, every one of the 2^16 draws r: the mean of what is stored is the value
    itself, exactly (computed in float64), for normal, subnormal, negative and binade-edge
    values; a bf16 value is stored unchanged whatever the draw."""
    gen = torch.Generator().manual_seed(0)
    xs = torch.cat([torch.randn(40, generator=gen), torch.randn(8, generator=gen) * 1e-39,
                    torch.tensor([1.0 - 2 ** -24, -3.9999998, 2 ** -126 * 1.5, 0.25, -0.0])])
    r = torch.arange(65536, dtype=torch.int32).to(torch.int16)  # every 16-bit draw once
    out = torch.empty(65536, dtype=torch.int16)
    for x in xs.tolist():
        xv = torch.full((65536,), x, dtype=torch.float32)
        assert _kernel("round_sr")(xv.data_ptr(), r.data_ptr(), out.data_ptr(), 65536) == 0
        got = out.view(torch.bfloat16).double()
        assert got.mean().item() == torch.tensor(x, dtype=torch.float32).double().item(), x
        assert set(got.unique().tolist()) <= {got.min().item(), got.max().item()}  # two neighbours at most


def test_the_draws_are_uniform_and_seeded():
    n = 1 << 20
    a, b, c = (torch.empty(n, dtype=torch.int16) for _ in range(3))
    _kernel("sr_bits")(7, a.data_ptr(), n)
    _kernel("sr_bits")(7, b.data_ptr(), n)
    _kernel("sr_bits")(8, c.data_ptr(), n)
    assert torch.equal(a, b) and not torch.equal(a, c)
    counts = torch.bincount((a.int() & 0xFFFF) >> 8, minlength=256).double()  # 256 buckets of the 16 bits
    chi2 = ((counts - n / 256) ** 2 / (n / 256)).sum().item()
    assert chi2 < 360  # 255 degrees of freedom: p ~ 1e-4


def test_stochastic_rounding_keeps_updates_below_half_an_ulp_on_average():
    """Weights at 1.0, gradients of one sign, lr 1e-4 (far below half an ulp of 1.0, 2^-8):
    rounding to nearest keeps every weight at 1.0; stochastic rounding moves the mean as fp32
    would, each weight by whole ulps."""
    n, steps, lr = 1 << 16, 200, 1e-4
    g = torch.full((n,), 1e-3, dtype=torch.bfloat16)
    results = {}
    for seed in (0, 12345):
        p = torch.ones(n, dtype=torch.bfloat16)
        m, v, step = torch.zeros(n), torch.zeros(n), torch.zeros(())
        opt = AdamW(lr=lr)
        for s in range(steps):
            opt.step(p, g, m, v, step, sr_seed=seed and seed + s)
        results[seed] = p.float()
    assert torch.equal(results[0], torch.ones(n))  # nearest: every update lost
    mean = results[12345].mean().item()
    assert abs((1.0 - mean) - steps * lr) < 0.05 * steps * lr  # fp32 would move it by steps x lr
    assert len(results[12345].unique()) >= 2
