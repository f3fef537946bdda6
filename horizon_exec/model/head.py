"""The head op: final norm, LM head and cross-entropy, forward and backward in one pass over
chunks of tokens, so the full (tokens, vocab) logits never exist.

Loss convention (transformers' causal LM loss): labels[t] is the target of position t, -100
means none (by default the next token inside each sequence, the last position has none;
the data loader also masks prompt tokens). The step's loss is the mean over every labelled
token of the whole step, so each micro-batch contributes sum(token losses) / n_step_tokens,
n_step_tokens = labelled tokens of the whole step (all micro-batches): with accumulation
this is the token mean of the full batch, the same number one unsplit batch gives.
"""
import torch

from horizon_exec.model.layers import rms_norm
from horizon_exec.model.xent import IGNORE, loss_and_grad_, loss_sum


def next_token_labels(tokens):
    """tokens (B, T) int64 -> labels (B, T): tokens shifted left, -100 at each sequence end."""
    labels = torch.full_like(tokens, IGNORE)
    labels[:, :-1] = tokens[:, 1:]
    return labels


def capped_logits(logits, cap: float):
    """Gemma 2's final_logit_softcapping: cap * tanh(logits / cap) (logits themselves when 0)."""
    return torch.tanh(logits / cap) * cap if cap else logits


def _capped_loss_and_grad(logits, labels, inv_n: float, loss_kernel: str, cap: float):
    """xent.loss_and_grad_ of one chunk's logits (consumed) through the soft-cap: the gradient
    times 1 - tanh^2, tanh kept beside the chunk until then."""
    t = torch.tanh(logits.div_(cap))
    del logits  # the caller passed it as a temporary: freed here
    g, part = loss_and_grad_(t * cap, labels, inv_n, loss_kernel)
    return g.mul_(t.mul_(t).neg_().add_(1.0)), part


def head_fwd_bwd(x, w_norm, w_lm, labels, n_step_tokens: int, eps: float, chunk: int,
                 g_norm_out, g_lm_out, loss_kernel: str = "torch", norm=rms_norm, softcap: float = 0.0):
    """x (B, T, H) activations entering the head; w_norm the final norm's tensors (its weight
    (H,), and a LayerNorm's bias); w_lm (V, H); labels (B*T,). Writes dL/dw_norm into
    g_norm_out (one (H,) tensor per norm tensor) and dL/dw_lm into g_lm_out (V, H) (all in the
    compute dtype; both None: a frozen head, whose weight gradients are not computed); returns
    (dx (B, T, H), loss contribution: fp32 scalar). loss_kernel:
    Policy.loss_kernel (xent.py); norm: the family's final norm (model/families final_norm);
    softcap: the logits' soft-cap (ModelSpec.logit_softcap; 0 none)."""
    B, T, H = x.shape
    N = B * T
    with torch.enable_grad():
        xg = x.reshape(N, H).detach().requires_grad_()
        frozen = g_lm_out is None
        wn = [t.detach().requires_grad_(not frozen) for t in w_norm]
        h = norm(xg, *wn, eps)                                      # (N, H)
    hd = h.detach()
    dh = torch.empty_like(hd)                                       # (N, H)
    if not frozen:
        g_lm_out.zero_()
    loss = torch.zeros((), dtype=torch.float32, device=x.device)
    inv_n = 1.0 / n_step_tokens
    for i in range(0, N, chunk):
        hc, lc = hd[i:i + chunk], labels[i:i + chunk]               # (c, H), (c,)
        c = hc.shape[0]
        # the GEMM's output goes straight in (no name here): the torch kernel frees it once widened
        if softcap:
            g, part = _capped_loss_and_grad(hc @ w_lm.t(), lc, inv_n, loss_kernel, softcap)
        else:
            g, part = loss_and_grad_(hc @ w_lm.t(), lc, inv_n, loss_kernel)  # (c, V) in x's dtype
        loss += part
        torch.mm(g, w_lm, out=dh[i:i + c])                          # (c, H)
        if not frozen:
            g_lm_out.addmm_(g.t(), hc)                              # (V, H) accumulates over chunks
        del g, part
    dx, *dwn = torch.autograd.grad(h, [xg] + ([] if frozen else wn), dh)
    for out, g in zip(g_norm_out or (), dwn):
        out.copy_(g)
    return dx.view(B, T, H), loss * inv_n


def head_loss(x, w_norm, w_lm, labels, eps: float, chunk: int, loss_kernel: str = "torch", norm=rms_norm,
              softcap: float = 0.0):
    """Forward only: x (B, T, H), w_norm the final norm's tensors, w_lm (V, H), labels (B*T,) -> fp32 scalar sum
    of the token losses over labelled positions (-100 skipped), chunk tokens at a time."""
    B, T, H = x.shape
    h = norm(x.reshape(B * T, H), *w_norm, eps)                     # (N, H)
    total = torch.zeros((), dtype=torch.float32, device=x.device)
    for i in range(0, B * T, chunk):
        total += loss_sum(capped_logits(h[i:i + chunk] @ w_lm.t(), softcap), labels[i:i + chunk], loss_kernel)
    return total
