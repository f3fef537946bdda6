"""Direct Preference Optimisation at the head (Policy.objective 'dpo'), chunked like the cross-entropy
head (head.py) so the full logits never exist.

Rows come in pairs, a chosen row then its rejected row; labels[t] is the target of position t
(-100: not a completion token). A row's log-probability is the sum over its labelled positions
of log softmax(logits)[label]. With the policy's (pi) and the reference's (ref) of the chosen (c)
and rejected (r) rows, as TRL's DPOTrainer defines its losses (loss_type):

    sigmoid   -log sigmoid(beta d),                 d = (pi_c - ref_c) - (pi_r - ref_r)
    ipo       ((pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r - 1 / (2 beta))^2,   n: labelled tokens
    robust    (-(1 - e) log sigmoid(beta d) + e log sigmoid(-beta d)) / (1 - 2 e),   e: label smoothing

and the step's loss is their mean over the step's pairs. The head's backward needs each row's
dL/dpi, which depends on both rows of its pair: a first pass over the chunks sums the rows'
log-probabilities (no gradient), the pair losses and their gradients are taken by autograd on
those sums, and a second pass computes each chunk's logits again and their gradient,
-dL/dpi_row x (softmax - onehot), into the input's gradient."""
import torch
import torch.nn.functional as F

from horizon_exec.model.head import _capped_loss_and_grad, capped_logits
from horizon_exec.model.xent import IGNORE, loss_and_grad_


def _chunk_logps(logits, labels):
    """(c,) fp32 log-probability of each position's label (0 where none)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    keep = labels != IGNORE
    out = lp.gather(1, labels.clamp(min=0).unsqueeze(1)).squeeze(1)
    return out.masked_fill_(~keep, 0.0)


def row_logps(h, w_lm, labels, rows: int, chunk: int, softcap: float = 0.0) -> torch.Tensor:
    """(rows,) fp32: each row's summed label log-probability, from h (rows*T, H) the normed head
    input and labels (rows*T,), chunk positions at a time."""
    T = h.shape[0] // rows
    per = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    for i in range(0, h.shape[0], chunk):
        per[i:i + chunk] = _chunk_logps(capped_logits(h[i:i + chunk] @ w_lm.t(), softcap), labels[i:i + chunk])
    return per.view(rows, T).sum(dim=1)


def pair_losses(pi, ref, counts, policy) -> torch.Tensor:
    """(pairs,) the DPO losses of rows [c0, r0, c1, r1, ...] (module docstring), differentiable in pi."""
    beta, e = policy.dpo_beta, policy.dpo_label_smoothing
    ratio = (pi - ref).view(-1, 2)                  # (pairs, [chosen, rejected])
    if policy.dpo_loss == "ipo":
        avg = ratio / counts.view(-1, 2).clamp(min=1.0)
        return (avg[:, 0] - avg[:, 1] - 1.0 / (2 * beta)) ** 2
    d = beta * (ratio[:, 0] - ratio[:, 1])
    if policy.dpo_loss == "robust":
        return (-(1 - e) * F.logsigmoid(d) + e * F.logsigmoid(-d)) / (1 - 2 * e)
    return -F.logsigmoid(d)


def dpo_head_fwd_bwd(x, w_norm, w_lm, labels, ref, inv_pairs: float, policy, eps: float, chunk: int,
                     loss_kernel: str = "torch", norm=None, softcap: float = 0.0, g_norm_out=None, g_lm_out=None):
    """x (B, T, H) the head's input, B rows in pairs; w_norm the final norm's tensors; w_lm (V, H);
    labels (B*T,); ref (B,) the reference's row log-probabilities; inv_pairs 1 / the step's pairs.
    Returns (dx (B, T, H), the micro-batch's part of the step's loss: fp32 scalar, and its reward
    sums (3,): the chosen rows' beta (pi - ref), the rejected rows', and the pairs whose chosen
    reward is the larger, as TRL logs them). g_norm_out,
    g_lm_out: where the head's weight gradients go, as head.head_fwd_bwd writes them (both None: a
    frozen head, adapters)."""
    B, T, H = x.shape
    N = B * T
    frozen = g_lm_out is None
    with torch.enable_grad():
        xg = x.reshape(N, H).detach().requires_grad_()
        wn = [t.detach().requires_grad_(not frozen) for t in w_norm]
        h = norm(xg, *wn, eps)
    hd = h.detach()
    with torch.no_grad():
        pi = row_logps(hd, w_lm, labels, B, chunk, softcap)
    counts = (labels != IGNORE).view(B, T).sum(dim=1).float()
    with torch.enable_grad():
        pig = pi.detach().requires_grad_()
        loss = pair_losses(pig, ref.float(), counts, policy).sum() * inv_pairs
        (coef,) = torch.autograd.grad(loss, pig)    # dL/dpi per row
    # dL/dlogits = dL/dpi x d(log p)/dlogits = -coef_row x (softmax - onehot): the cross-entropy's
    # gradient (with inv_n 1) scaled per row
    weight = (-coef).repeat_interleave(T)          # (N,)
    dh = torch.empty_like(hd)
    if not frozen:
        g_lm_out.zero_()
    for i in range(0, N, chunk):
        hc, lc = hd[i:i + chunk], labels[i:i + chunk]
        if softcap:
            g, _ = _capped_loss_and_grad(hc @ w_lm.t(), lc, 1.0, loss_kernel, softcap)
        else:
            g, _ = loss_and_grad_(hc @ w_lm.t(), lc, 1.0, loss_kernel)
        g.mul_(weight[i:i + chunk].to(g.dtype).unsqueeze(1))
        torch.mm(g, w_lm, out=dh[i:i + g.shape[0]])
        if not frozen:
            g_lm_out.addmm_(g.t(), hc)              # (V, H) accumulates over chunks
        del g
    dx, *dwn = torch.autograd.grad(h, [xg] + ([] if frozen else wn), dh)
    for out, g in zip(g_norm_out or (), dwn):
        out.copy_(g)
    rewards = policy.dpo_beta * (pi - ref.float()).view(-1, 2)  # (pairs, [chosen, rejected])
    stats = torch.stack([rewards[:, 0].sum(), rewards[:, 1].sum(), (rewards[:, 0] > rewards[:, 1]).float().sum()])
    return dx.view(B, T, H), loss.detach(), stats
