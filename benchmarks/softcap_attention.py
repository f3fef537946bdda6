"""Benchmark: Gemma 2's soft-capped attention, Horizon's chunked kernel against torch's fused
flex_attention, forward + backward, at Gemma 2's own attention shapes.

Horizon runs soft-capped attention (scores z = cap * tanh(scale * q.k / cap)) as a custom autograd
function in chunks of 128 query rows (horizon_exec/model/softcap_attention.py), on every device:
SDPA cannot cap scores. On a GPU the same scores can go through one fused kernel,
torch.nn.attention.flex_attention with a score_mod (compiled by Triton), which never writes the
scores to memory: horizon_exec/model/flex_softcap.py, which the executor runs on a GPU. This script measures what the fused path would save, as a ratio against the
chunked kernel run side by side on the same inputs, and how far its results are from the chunked
kernel's (relative error of o, dq, dk, dv). SDPA's flash kernel without the cap is printed as
the floor (it computes other scores: a speed reference only).

Shapes (B=1, bf16): gemma-2-9b (16 heads, 8 kv heads, head 256, query scale 256^-0.5) and
gemma-2-27b (32 heads, 16 kv heads, head 128, query scale 144^-0.5), each at T tokens with its
sliding window (4096) and without (global layers). --small: a CPU-sized check of the script.

  python benchmarks/softcap_attention.py                 # a GPU box
  python benchmarks/softcap_attention.py --small --device cpu
"""
import argparse
import time

import torch
import torch.nn.functional as F

from horizon_exec.model.flex_softcap import flex_softcap_attention
from horizon_exec.model.softcap_attention import softcap_attention

SHAPES = {  # name: heads, kv heads, head width, query scale
    "gemma-2-9b": (16, 8, 256, 256 ** -0.5),
    "gemma-2-27b": (32, 16, 128, 144 ** -0.5),
}
CAP = 50.0  # attn_logit_softcapping of both


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _flex(nh: int, nkv: int, T: int, window: int, scale: float, device: str):
    return lambda q, k, v: flex_softcap_attention(q, k, v, scale, CAP, window)


def _sdpa(nh: int, nkv: int, T: int, window: int, scale: float, device: str):
    if not window or window >= T:
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                              enable_gqa=nh != nkv)
    i = torch.arange(T, device=device)
    allowed = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale,
                                                          enable_gqa=nh != nkv)


def _timed(fn, q, k, v, do, reps: int, sync) -> tuple[float, tuple]:
    """Median seconds of forward + backward, and the last run's (o, dq, dk, dv)."""
    times, out = [], None
    for i in range(reps + 2):  # two warm-ups (the first compiles)
        for t in (q, k, v):
            t.grad = None
        sync()
        t0 = time.perf_counter()
        o = fn(q, k, v)
        o.backward(do)
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t0)
        out = (o.detach(), q.grad, k.grad, v.grad)
    return sorted(times)[len(times) // 2], out


def run(name: str, T: int, window: int, device: str, reps: int) -> None:
    nh, nkv, hd, scale = SHAPES[name]
    g = torch.Generator(device=device).manual_seed(0)
    dt = torch.bfloat16
    q, k, v = (torch.randn(1, n, T, hd, device=device, dtype=dt, generator=g).requires_grad_()
               for n in (nh, nkv, nkv))
    do = torch.randn(1, nh, T, hd, device=device, dtype=dt, generator=g)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    label = f"{name} T={T} window={window or 'none'}"
    chunked_s, ref = _timed(lambda a, b, c: softcap_attention(a, b, c, scale, CAP, window), q, k, v, do, reps, sync)
    pairs = sum(min(i + 1, window or T) for i in range(T))  # (query, key) pairs seen
    flops = 14 * nh * hd * pairs  # 2 FLOPs a multiply-add: 2 GEMMs forward, 5 backward (scores recomputed)
    line = f"{label}: chunked {chunked_s * 1e3:8.2f} ms ({flops / chunked_s / 1e12:6.1f} TFLOP/s)"
    for kind, make in (("flex", _flex), ("sdpa, no cap", _sdpa)):
        try:
            s, out = _timed(make(nh, nkv, T, window, scale, device), q, k, v, do, reps, sync)
        except Exception as e:  # noqa: BLE001 -- a kernel this torch cannot build is a result to print
            line += f" | {kind}: failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
            continue
        line += f" | {kind} {s * 1e3:8.2f} ms = {chunked_s / s:5.2f}x faster"
        if kind == "flex":
            errs = [_rel(a, b) for a, b in zip(out, ref)]
            line += " (rel. err o/dq/dk/dv vs chunked " + "/".join(f"{e:.1e}" for e in errs) + ")"
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq", type=int, default=8192, help="tokens per sequence (default 8192, Gemma 2's context)")
    ap.add_argument("--reps", type=int, default=5, help="timed repeats after two warm-ups (median)")
    ap.add_argument("--small", action="store_true", help="T=512, window 256: a check of the script on a CPU")
    a = ap.parse_args()
    T, window = (512, 256) if a.small else (a.seq, 4096)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if a.device.startswith('cuda') else 'cpu'}")
    for name in SHAPES:
        for w in (window, 0):
            run(name, T, w, a.device, a.reps)


if __name__ == "__main__":
    main()
