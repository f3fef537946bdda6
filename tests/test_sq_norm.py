"""The per-unit squared gradient norm (runtime/sq_norm.py): on the host, float64 sums (torch's
float32 norm is off by ~1e-4 over a few million elements) and no float32 copy of the whole gradient (fresh pages every step on a large
embedding, measured 0.45 s of a 1.25 s step on an H200 box)."""
import resource

import pytest
import torch

from horizon_exec.runtime.sq_norm import CHUNK_ELEMS, sq_norm


def _ref(g):
    return float(g.double().square().sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [0, 7, CHUNK_ELEMS, 3 * CHUNK_ELEMS + 5])
def test_equals_the_float64_sum_of_squares(dtype, n):
    g = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    got = sq_norm(g)
    assert got.dtype == torch.float64 and got.dim() == 0
    assert float(got) == pytest.approx(_ref(g), rel=1e-12, abs=1e-30)


def test_a_2d_view_is_reduced_whole():
    g = torch.randn(300, 7000).bfloat16()[:, :5000]  # not contiguous
    assert float(sq_norm(g)) == pytest.approx(_ref(g), rel=1e-12)


def test_a_bf16_host_gradient_is_reduced_without_a_float32_copy():
    n = 32 * CHUNK_ELEMS  # 64 MiB of bf16: a float32 copy faults in 32768 fresh 4 KiB pages
    g = torch.ones(n, dtype=torch.bfloat16)
    sq_norm(g)  # the thread's scratch is made once
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    assert float(sq_norm(g)) == n
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    assert faults < (4 * n // 4096) // 20, f"{faults} page faults: a float32 copy of the gradient was made"


def test_rows_norm_equals_the_whole_norm_of_a_row_sparse_matrix():
    """The embedding's gradient: zero outside the step's token rows, so the rows' norm is the
    whole one (what embed_bwd now computes instead of sweeping the vocabulary)."""
    from horizon_exec.runtime.sq_norm import sq_norm_rows
    V, H = 5000, 3000  # 349 rows a chunk: several chunks, the last one part full
    g = torch.zeros(V, H, dtype=torch.bfloat16)
    ids = torch.randint(0, V, (4000,), generator=torch.Generator().manual_seed(1))
    g.index_add_(0, ids, torch.randn(4000, H, generator=torch.Generator().manual_seed(2)).bfloat16())
    rows = torch.unique(ids)
    assert float(sq_norm_rows(g, rows)) == pytest.approx(_ref(g), rel=1e-12)
    assert float(sq_norm_rows(g, rows[:10])) == pytest.approx(_ref(g[rows[:10]]), rel=1e-12)
