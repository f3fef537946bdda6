"""The loss of one chunk of LM-head logits and its gradient, by either of the policy's loss
kernels (Policy.loss_kernel); head.py calls these once per chunk, calibration times them.

'torch': whole-tensor torch kernels on any device: an fp32 copy of the chunk, logsumexp, the
    target gather, then the softmax gradient in place in fp32 and a cast back (the chunk's
    c x V values pass through memory about eight times, and the fp32 copy and logsumexp's
    x - max are c x V x 8 bytes beside the logits).
'fused': native/xent.c on the CPU backend: each row's max, sum of exponentials, loss and
    gradient in one sweep while the row is in cache, the gradient written over the logits;
    nothing of c x V is allocated. The same arithmetic in fp32 (within a few fp32 ulps: its
    exp is a polynomial; the gradient rounds to the same bf16 but at the rare ties).

Loss convention: head.py's (labels -100 are skipped; the caller scales the sum).
"""
import torch

from horizon_exec.optim import native
from horizon_sim.errors import HorizonError
from horizon_sim.specs.policy import Policy

IGNORE = -100


def fused_unavailable(device: str) -> str:
    """'' when the fused loss kernel runs here, else why not (one clause)."""
    if not device.startswith("cpu"):
        return f"it runs on the CPU backend only (this run's device is {device})"
    if native.xent() is None:
        return f"the native kernels cannot be used here: {native.status()}"
    return ""


def default_loss_kernel(device: str) -> str:
    """`horizon train`'s loss kernel when none is given: 'fused' where it runs (the CPU
    backend with the native kernels built), else 'torch' (Policy.default_loss_kernel's rule,
    with 'where it runs' checked here)."""
    return Policy.default_loss_kernel(cpu_backend=not fused_unavailable(device))


def resolve_loss_kernel(kernel: str | None, device: str, given: bool) -> str:
    """`horizon train`'s loss kernel: the one --loss-kernel gives; else a job's, unless it is
    'fused' where that cannot run (a job planned on a CPU file, trained on a GPU box): then,
    as with no job, this machine's default (the job's lines name the change as that)."""
    if kernel is None or (kernel == "fused" and not given and fused_unavailable(device)):
        return default_loss_kernel(device)
    return kernel


def check_loss_kernel(kernel: str, device: str) -> None:
    """Refuse a policy whose loss kernel cannot run on `device`, naming the fix."""
    why = fused_unavailable(device) if kernel == "fused" else ""
    if why:
        raise HorizonError(f"policy loss_kernel='fused' (--loss-kernel fused): {why}; use --loss-kernel torch")


def loss_and_grad_(logits: torch.Tensor, labels: torch.Tensor, scale: float, kernel: str):
    """logits (c, V): the head GEMM's output in the compute dtype, consumed; labels (c,) int64.
    Returns (dL/dlogits (c, V) in logits' dtype, sum over labelled rows of the token losses:
    an fp32 scalar) for L = scale * that sum. 'fused' returns the logits tensor itself,
    overwritten by the gradient."""
    if kernel == "fused":
        return logits, _fused(logits, labels, scale, write=True)
    c, dtype = logits.shape[0], logits.dtype
    lg = logits.float()                                         # (c, V) fp32, like HF's upcast
    del logits  # freed here when the caller passed it as a temporary (head.py does)
    valid = labels != IGNORE
    safe = torch.where(valid, labels, 0)
    lse = torch.logsumexp(lg, dim=-1)                           # (c,)
    tgt = lg.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(valid, lse - tgt, 0.0).sum()
    # dL/dlogits = (softmax - onehot) * scale on labelled rows, 0 elsewhere.
    p = lg.sub_(lse[:, None]).exp_()
    p[torch.arange(c, device=p.device), safe] -= valid.to(p.dtype)
    p.mul_((valid.to(p.dtype) * scale)[:, None])
    return p.to(dtype), loss


def loss_sum(logits: torch.Tensor, labels: torch.Tensor, kernel: str) -> torch.Tensor:
    """Forward only: the fp32 sum of the labelled rows' token losses of logits (c, V)."""
    if kernel == "fused":
        return _fused(logits, labels, 0.0, write=False)
    lg = logits.float()
    valid = labels != IGNORE
    tgt = lg.gather(1, torch.where(valid, labels, 0)[:, None]).squeeze(1)
    return torch.where(valid, torch.logsumexp(lg, dim=-1) - tgt, 0.0).sum()


def _fused(logits: torch.Tensor, labels: torch.Tensor, scale: float, write: bool) -> torch.Tensor:
    fn = native.xent()
    if fn is None:
        raise HorizonError(f"the fused loss kernel is unavailable: {native.status()}; use --loss-kernel torch")
    if logits.device.type != "cpu" or logits.dtype not in (torch.bfloat16, torch.float32) or logits.dim() != 2 \
            or logits.stride(1) != 1:
        raise HorizonError(f"the fused loss kernel takes CPU rows of bf16 or fp32 logits, not {logits.dtype} "
                           f"{tuple(logits.shape)} on {logits.device}")
    rows, vocab = logits.shape
    labels = labels.to(torch.int64).contiguous()
    row_loss = torch.empty(rows, dtype=torch.float32)
    rc = fn(logits.data_ptr(), int(logits.dtype == torch.bfloat16), labels.data_ptr(), rows, vocab,
            logits.stride(0), scale, int(write), row_loss.data_ptr(), torch.get_num_threads())
    if rc:
        bad = labels[(labels != IGNORE) & ((labels < 0) | (labels >= vocab))]
        raise HorizonError(f"label {int(bad[0]) if bad.numel() else '?'} is outside the vocabulary "
                           f"[0, {vocab}) (-100: no label)")
    return row_loss.sum()
