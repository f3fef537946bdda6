"""Attention that SDPA cannot run, in chunks of query rows: soft-capped scores (Gemma 2's
attn_logit_softcapping: z = cap * tanh(scale * q.k / cap)) and attention sinks (gpt-oss: one more
learned logit per head in each row's softmax, which takes probability and gives no value), each
masked (causal, a sliding window, documents), softmax, times v.

It runs in chunks of CHUNK_ROWS query rows, each against the keys its rows may see (causal: up
to its last row; a window: from its first row's window on), so no (T, T) score matrix exists
at once and none is kept for the backward: like a flash kernel, the forward keeps q, k, v, o and
the fp32 logsumexp per row (a sink's logit included in it), and the backward recomputes each
chunk's scores. Scores, softmax and their gradients are in fp32; the products with k and v run
in the compute dtype, as transformers' eager attention runs them; dk and dv sum over the chunks
in fp32. A sink's gradient is -sum over rows of its probability times rowsum(dO o): the
probability it took scaled every value's share down by the same factor.

Grouped kv heads: a chunk of q (B, nh, c, hd) is viewed as (B, nkv, g c, hd), so each kv head
meets its g query heads' rows in one product, without copying k or v per query head.
schedule/work.py (softcap_attention_bytes) prices what a chunk holds."""
import contextlib
import threading

import torch

CHUNK_ROWS = 128
"""Query rows per chunk: a chunk's fp32 scores are B x heads x 128 x (keys) x 4 bytes
(horizon_sim/schedule/work.py SOFTCAP_CHUNK_ROWS, which must equal it)."""

_phase = threading.local()


def phase() -> str | None:
    """'attention_fwd' or 'attention_bwd' while this thread runs inside the soft-capped
    attention, else None: a dispatch mode that sorts kernels (calibration's KernelTimer, the
    op-by-op test) counts the GEMMs and elementwise kernels it issues as attention, which is
    what they are (SDPA's are inside one aten call)."""
    return getattr(_phase, "name", None)


@contextlib.contextmanager
def _inside(name: str):
    _phase.name = name
    try:
        yield
    finally:
        _phase.name = None


def _blocked(i0: int, i1: int, j0: int, window: int, docs, device):
    """bool (c, n), or (B, 1, 1, c, n) with documents: True where query i0.. may NOT see key j0..."""
    i = torch.arange(i0, i1, device=device)[:, None]
    j = torch.arange(j0, i1, device=device)[None, :]
    no = j > i
    if window:
        no |= i - j >= window
    if docs is not None:
        no = no | (docs[:, i0:i1, None] != docs[:, None, j0:i1])[:, None, None]
    return no


def _chunks(T: int, window: int):
    for i0 in range(0, T, CHUNK_ROWS):
        i1 = min(T, i0 + CHUNK_ROWS)
        yield i0, i1, max(0, i0 - window + 1) if window else 0


def _rows(x, i0: int, i1: int, g: int):
    """Rows i0..i1-1 of x (B, nkv, g, T, d) as (B, nkv, g (i1 - i0), d)."""
    B, nkv, _, _, d = x.shape
    return x[..., i0:i1, :].reshape(B, nkv, g * (i1 - i0), d)


def _tanh_scores(qc, kc, scale: float, cap: float):
    """fp32 tanh(scale q.k / cap) (B, nkv, g c, n): the product in the compute dtype, widened;
    with cap 0 (no soft-cap) the plain scaled scores scale q.k."""
    t = torch.matmul(qc, kc.transpose(-1, -2)).float()
    return t.mul_(scale / cap).tanh_() if cap else t.mul_(scale)


class _SoftcapAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale: float, cap: float, window: int, docs, sinks=None):
        with _inside("attention_fwd"):
            return _SoftcapAttention._forward(ctx, q, k, v, scale, cap, window, docs, sinks)

    @staticmethod
    def backward(ctx, do):
        with _inside("attention_bwd"):
            return _SoftcapAttention._backward(ctx, do)

    @staticmethod
    def _forward(ctx, q, k, v, scale: float, cap: float, window: int, docs, sinks):
        B, nh, T, hd = q.shape
        nkv = k.shape[1]
        g = nh // nkv
        qg = q.view(B, nkv, g, T, hd)
        o = torch.empty_like(qg)
        lse = torch.empty(B, nkv, g, T, dtype=torch.float32, device=q.device)
        sink = None if sinks is None else sinks.float().view(1, nkv, g, 1, 1)
        for i0, i1, j0 in _chunks(T, window):
            c = i1 - i0
            z = _tanh_scores(_rows(qg, i0, i1, g), k[:, :, j0:i1], scale, cap)
            if cap:
                z.mul_(cap)
            n = z.shape[-1]
            z = z.view(B, nkv, g, c, n).masked_fill_(_blocked(i0, i1, j0, window, docs, q.device), float("-inf"))
            m = torch.logsumexp(z, dim=-1, keepdim=True)                    # (B, nkv, g, c, 1)
            if sink is not None:  # the sink's logit joins each row's normaliser
                m = torch.logaddexp(m, sink)
            lse[..., i0:i1] = m[..., 0]
            p = z.sub_(m).exp_().to(v.dtype).view(B, nkv, g * c, n)
            del z, m
            o[..., i0:i1, :] = torch.matmul(p, v[:, :, j0:i1]).view(B, nkv, g, c, hd)
            del p
        ctx.save_for_backward(q, k, v, o, lse, docs, sinks)
        ctx.args = scale, cap, window
        return o.view(B, nh, T, hd)

    @staticmethod
    def _backward(ctx, do):
        q, k, v, o, lse, docs, sinks = ctx.saved_tensors
        scale, cap, window = ctx.args
        B, nh, T, hd = q.shape
        nkv = k.shape[1]
        g = nh // nkv
        qg, dog = q.view(B, nkv, g, T, hd), do.reshape(B, nkv, g, T, hd)
        dq = torch.empty_like(qg)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        delta = (dog.float() * o.float()).sum(-1, keepdim=True)           # (B, nkv, g, T, 1): rowsum(dO o)
        for i0, i1, j0 in _chunks(T, window):
            c = i1 - i0
            qc, dc = _rows(qg, i0, i1, g), _rows(dog, i0, i1, g)            # (B, nkv, g c, hd)
            kc, vc = k[:, :, j0:i1], v[:, :, j0:i1]                          # (B, nkv, n, hd)
            t = _tanh_scores(qc, kc, scale, cap)
            n = t.shape[-1]
            p = (t * cap if cap else t).view(B, nkv, g, c, n).masked_fill_(
                _blocked(i0, i1, j0, window, docs, q.device), float("-inf"))
            p = p.sub_(lse[..., i0:i1, None]).exp_().view(B, nkv, g * c, n)  # softmax, fp32
            dv[:, :, j0:i1] += torch.matmul(p.to(v.dtype).transpose(-1, -2), dc)
            ds = torch.matmul(dc, vc.transpose(-1, -2)).float()             # dP
            ds.view(B, nkv, g, c, n).sub_(delta[..., i0:i1, :])
            ds.mul_(p)                                                       # dZ = P (dP - rowsum(dO o))
            del p
            if cap:
                ds.mul_(t.mul_(t).neg_().add_(1.0))                         # dZ/dS = 1 - tanh^2
            ds.mul_(scale)
            del t
            ds = ds.to(q.dtype)
            dq[..., i0:i1, :] = torch.matmul(ds, kc).view(B, nkv, g, c, hd)
            dk[:, :, j0:i1] += torch.matmul(ds.transpose(-1, -2), qc)
            del ds
        dsinks = None
        if sinks is not None:  # dL/ds = -sum over rows of P(sink) rowsum(dO o)
            p_sink = (sinks.float().view(1, nkv, g, 1) - lse).exp_()         # (B, nkv, g, T)
            dsinks = -(p_sink.mul_(delta[..., 0])).sum(dim=(0, 3)).view(nh).to(sinks.dtype)
        return dq.view(B, nh, T, hd), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, dsinks


def softcap_attention(q, k, v, scale: float, cap: float, window: int = 0, docs=None, sinks=None):
    """q (B, nh, T, hd), k, v (B, nkv, T, hd) -> (B, nh, T, hd): causal attention under a sliding
    `window` (0: none) and documents (docs (B, T) int, or None), scores soft-capped at `cap`
    (0: not capped), with a sink logit per query head (sinks (nh,), or None)."""
    return _SoftcapAttention.apply(q, k, v, float(scale), float(cap), int(window), docs, sinks)
