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


def case(T: int, hd: int, with_docs: bool):
    """float64 q (2 sequences, 4 heads), k and v (2 kv heads) of T tokens, documents (three in
    the second sequence, two in the first) or None, and the generator for what follows."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, T, hd, generator=gen, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    docs = None
    if with_docs:
        docs = torch.zeros(2, T, dtype=torch.int64)
        docs[:, T * 2 // 5:] = 1
        docs[1, T * 2 // 3:] = 2
    return q, k, v, docs, gen


@pytest.mark.parametrize("rows", [5, 128])  # several chunks (the last one short), or one
@pytest.mark.parametrize("window", [0, 6])
@pytest.mark.parametrize("with_docs", [False, True])
def test_output_and_gradients_equal_the_eager_formula(monkeypatch, rows, window, with_docs):
    monkeypatch.setattr(sca, "CHUNK_ROWS", rows)
    q, k, v, docs, gen = case(17, 8, with_docs)
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


@pytest.mark.parametrize("variant", ["softcap", "sinks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 4, 2, 512, 32, 0, False), (2, 4, 2, 300, 32, 100, False),
                                   (1, 8, 1, 256, 16, 0, True), (2, 4, 4, 384, 32, 128, True)],
                         ids=["grouped-causal", "window", "one-kv-head-docs", "mha-window-docs"])
def test_the_planned_score_passes_are_a_kernel_by_kernel_count(dtype, shape, variant):
    """work.softcap_elementwise_bytes of its forward and its backward against what its own
    elementwise kernels read plus write, counted aten call by aten call as the calibration's
    KernelTimer counts (its products are attention FLOPs), with q, k, v and dO in the layouts
    the executor's block gives them (layers.self_attention: (B, T, heads, hd) memory viewed as
    (B, heads, T, hd)): exactly, for grouped and plain heads, several chunks, a window and
    document masks, in fp32 and bf16."""
    from horizon_sim.schedule import work
    from horizon_sim.specs.model import ModelSpec
    B, nh, nkv, T, hd, window, with_docs = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, h, hd, generator=gen).to(dtype).transpose(1, 2).detach().requires_grad_()
               for h in (nh, nkv, nkv))
    docs = None
    if with_docs:
        docs = torch.zeros(B, T, dtype=torch.int64)
        docs[:, T // 2:] = 1
    d_o = torch.ones(B, T, nh, hd, dtype=dtype).transpose(1, 2)  # dO as the block's reshape gives it back
    from horizon_exec.measure.calibrate import KernelTimer
    sinks = torch.randn(nh, generator=gen).to(dtype).requires_grad_() if variant == "sinks" else None
    with KernelTimer() as count:
        sca.softcap_attention(q, k, v, 0.1, 50.0 if sinks is None else 0.0, window, docs, sinks).backward(d_o)
    got = count.attention_bytes
    shape = dict(n_layers=1, hidden=nh * hd, n_heads=nh, n_kv_heads=nkv, head_dim=hd, ffn_hidden=64, vocab=64)
    m = (ModelSpec(family="gemma2", **shape, attn_softcap=50.0) if sinks is None else
         ModelSpec(family="gpt_oss", **shape, n_experts=2, experts_per_token=1, expert_ffn_hidden=64,
                   norm_topk_prob=True, swiglu_alpha=1.702, swiglu_limit=7.0))
    a = torch.empty((), dtype=dtype).element_size()
    assert work.softcap_elementwise_bytes(m, B, T, a, False, window, with_docs) == got["attention_fwd"]
    assert work.softcap_elementwise_bytes(m, B, T, a, True, window, with_docs) == got["attention_bwd"]


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["grouped", "one-query-head-per-kv-head"])
def test_the_blocks_score_passes_are_the_planned_ones(kv_heads):
    """In Gemma 2's block as the executor runs it (calibration's block_pass: a forward, then the
    recomputing backward), the soft-capped attention's elementwise bytes are the planned forward
    twice and backward once (bf16, three chunks of rows)."""
    from dataclasses import replace

    from horizon_exec.measure.calibrate import KernelTimer, block_pass
    from horizon_sim.schedule import work
    from tests.test_families import tiny
    m = replace(tiny("gemma2"), n_layers=1, hidden=128, n_kv_heads=kv_heads, ffn_hidden=256, layer_windows=())
    B, T = 2, 384
    fn = block_pass(m, B, T, torch.bfloat16, "cpu")
    with KernelTimer() as count:
        fn()
    want = 2 * work.softcap_elementwise_bytes(m, B, T, 2, False) + work.softcap_elementwise_bytes(m, B, T, 2, True)
    assert sum(count.attention_bytes.values()) == want
