"""The soft-capped attention (horizon_exec/model/softcap_attention.py), which SDPA cannot run,
against transformers' eager formula (Gemma2's eager_attention_forward: scores times scale,
capped, masked, fp32 softmax, times v) in float64: its output and its q, k, v gradients, over
several chunks of query rows, with grouped kv heads, a sliding window and document masks."""
import pytest
import torch

import horizon_exec.model.softcap_attention as sca


def _eager(q, k, v, scale, cap, window, docs):
    B, nh, T, hd = q.shape
    g = nh // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.tanh((q @ k.transpose(-1, -2)) * scale / cap) * cap
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    ok = j <= i
    if window:
        ok = ok & (i - j < window)
    if docs is not None:
        ok = ok & (docs[:, :, None] == docs[:, None, :])[:, None]
    return torch.softmax(s.masked_fill(~ok, float("-inf")), -1) @ v


@pytest.mark.parametrize("rows", [5, 128])  # several chunks (the last one short), or one
@pytest.mark.parametrize("window", [0, 6])
@pytest.mark.parametrize("with_docs", [False, True])
def test_output_and_gradients_equal_the_eager_formula(monkeypatch, rows, window, with_docs):
    monkeypatch.setattr(sca, "CHUNK_ROWS", rows)
    gen = torch.Generator().manual_seed(0)
    B, nh, nkv, T, hd = 2, 4, 2, 17, 8
    q, k, v = (torch.randn(B, h, T, hd, generator=gen, dtype=torch.float64, requires_grad=True)
               for h in (nh, nkv, nkv))
    docs = None
    if with_docs:
        docs = torch.zeros(B, T, dtype=torch.int64)
        docs[:, 7:] = 1
        docs[1, 12:] = 2
    got = sca.softcap_attention(q, k, v, 0.3, 2.0, window, docs)
    want = _eager(q, k, v, 0.3, 2.0, window, docs)
    dy = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    # its scores and softmax are fp32 (as a kernel's are): within fp32's rounding of the float64 formula
    assert (got - want).abs().max() < 1e-6
    for a, b in zip(torch.autograd.grad(got, (q, k, v), dy), torch.autograd.grad(want, (q, k, v), dy)):
        assert (a - b).abs().max() < 1e-6


def test_a_chunk_sees_only_the_keys_of_its_window():
    """With a window, each chunk's scores span its rows plus the window behind them, not the
    whole sequence (what keeps its memory flat in the sequence's length)."""
    assert [(i0, i1, j0) for i0, i1, j0 in sca._chunks(300, 64)] == [(0, 128, 0), (128, 256, 65), (256, 300, 193)]
