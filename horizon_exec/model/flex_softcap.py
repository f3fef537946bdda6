"""Soft-capped attention on a GPU in one fused kernel: torch's flex_attention with the cap as
its score_mod, compiled by Triton. The scores never reach device memory (the chunked kernel,
softcap_attention.py, writes each chunk's fp32 scores, tanh and probabilities, and reads them
again in its backward); like a flash kernel it keeps o and the fp32 logsumexp for the backward.

On a GPU it is several times the chunked kernel's speed at Gemma 2's shapes
(benchmarks/softcap_attention.py measures both side by side). flex_attention's backward does
not run on the CPU, so the CPU backend keeps the chunked kernel (`usable`)."""
import functools

import torch


def usable(q) -> bool:
    """q is on a CUDA device and this torch has flex_attention."""
    return q.is_cuda and _available()


@functools.cache
def _available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _flex():
    from torch.nn.attention.flex_attention import flex_attention
    # compiled once per process; torch.compile specializes it per shape, cap and mask function
    return torch.compile(flex_attention, dynamic=False)


def _visible(window: int, docs):
    """The mask function: causal, within `window` (0: none), within each row's document."""
    def mask_mod(b, h, q_idx, kv_idx):
        seen = q_idx >= kv_idx
        if window:
            seen = seen & (q_idx - kv_idx < window)
        if docs is not None:
            seen = seen & (docs[b, q_idx] == docs[b, kv_idx])
        return seen
    return mask_mod


@functools.lru_cache(maxsize=16)
def _plain_mask(T: int, window: int, device: str):
    """The block mask without documents: one per (length, window, device), reused every call."""
    from torch.nn.attention.flex_attention import create_block_mask
    return create_block_mask(_visible(window, None), None, None, T, T, device=device)


def flex_softcap_attention(q, k, v, scale: float, cap: float, window: int = 0, docs=None):
    """softcap_attention's contract (q (B, nh, T, hd), k, v (B, nkv, T, hd) -> (B, nh, T, hd);
    causal, a sliding `window`, documents docs (B, T)) through one fused kernel."""
    from torch.nn.attention.flex_attention import create_block_mask
    B, nh, T, _ = q.shape

    def score_mod(score, b, h, q_idx, kv_idx):  # score is already scale * q.k
        return cap * torch.tanh(score / cap)

    if docs is None:
        mask = _plain_mask(T, int(window), str(q.device))
    else:
        mask = create_block_mask(_visible(int(window), docs), B, None, T, T, device=q.device)
    return _flex()(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale, enable_gqa=k.shape[1] != nh)
