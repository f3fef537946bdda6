"""bf16 GEMMs on this CPU: PyTorch's own kernel against bf16 through fp32 (the CPU backend's, on
CPUs without bf16 matrix instructions: horizon_exec/device/bf16_gemm.py) and plain fp32, on the
GEMMs of one layer of a model (forward x W^T, and the backward's G W and G^T x) and its causal
attention's backward (the flash kernel, sequences of --seq), side by side in interleaved rounds;
then, with --train, one `horizon train` step in each compute dtype.

    .venv/bin/python benchmarks/bf16_gemm.py [--model tiny] [--tokens 512] [--seq 128] [--rounds 3] [--train]

Prints per kernel the milliseconds of each and the ratios native/through-fp32 and
through-fp32/fp32. On a CPU with bf16 matrix instructions the CPU backend keeps PyTorch's kernel
(the through-fp32 column is then what it would cost, not what a run takes).
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from horizon_exec.device import bf16_gemm  # noqa: E402
from horizon_exec.device.compute_dtype import cpu_has_bf16_matmul  # noqa: E402
from horizon_sim.specs.hf_config import load_model  # noqa: E402


def layer_gemms(model, tokens: int) -> dict:
    """name -> (a, b) stored shapes and whether each is used transposed, of a @ b for the
    layer's projections as autograd calls them: forward x W^T, backward G W and G^T x."""
    h, f = model.hidden, model.ffn_hidden
    out = {}
    for name, (n_out, n_in) in {"qkv": (model.q_dim + 2 * model.kv_dim, h), "mlp up": (2 * f, h),
                                "mlp down": (h, f)}.items():
        out[f"{name} x W^T"] = (((tokens, n_in), False), ((n_out, n_in), True))
        out[f"{name} G W"] = (((tokens, n_out), False), ((n_out, n_in), False))
        out[f"{name} G^T x"] = (((tokens, n_out), True), ((tokens, n_in), False))
    return out


def _operand(shape, transposed: bool, dtype) -> torch.Tensor:
    t = torch.randn(*shape).to(dtype)
    return t.t() if transposed else t


def best_ms(fn, reps: int = 3) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def attention_backward(model, tokens: int, seq: int, dtype):
    """fn() running the layer's causal SDPA backward (grouped kv heads, as the template calls
    it) on tokens // seq sequences of `seq`, its forward done once."""
    import torch.nn.functional as F
    seq = min(seq, tokens)  # (fewer tokens than a sequence: one sequence of them)
    b, hd = tokens // seq, model.hd
    q, k, v = (torch.randn(b, n, seq, hd).to(dtype).requires_grad_()
               for n in (model.n_heads, model.n_kv_heads, model.n_kv_heads))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=model.n_kv_heads != model.n_heads)
    go = torch.randn_like(o)
    return lambda: torch.autograd.grad(o, [q, k, v], go, retain_graph=True)


def _interleaved(fns: dict, rounds: int) -> tuple[float, float, float]:
    """Median ms of fns['native'], fns['through'] (with bf16_gemm held) and fns['fp32'] over
    interleaved rounds (the VM's speed drifts between rounds, not within one)."""
    t = {k: [] for k in fns}
    for _ in range(rounds):
        t["native"].append(best_ms(fns["native"]))
        bf16_gemm.acquire()
        try:
            t["through"].append(best_ms(fns["through"]))
        finally:
            bf16_gemm.release()
        t["fp32"].append(best_ms(fns["fp32"]))
    return tuple(statistics.median(t[k]) for k in ("native", "through", "fp32"))


def gemm_rows(model, tokens: int, rounds: int, threads: int) -> list[tuple[str, float, float, float]]:
    torch.set_num_threads(threads)
    rows = []
    for name, (sa, sb) in layer_gemms(model, tokens).items():
        a32, b32 = _operand(*sa, torch.float32), _operand(*sb, torch.float32)
        a16, b16 = a32.bfloat16(), b32.bfloat16()
        rows.append((name, *_interleaved({"native": lambda: a16 @ b16, "through": lambda: a16 @ b16,
                                          "fp32": lambda: a32 @ b32}, rounds)))
    return rows


def attention_row(model, tokens: int, seq: int, rounds: int, threads: int) -> tuple[str, float, float, float]:
    torch.set_num_threads(threads)
    bf, f32 = attention_backward(model, tokens, seq, torch.bfloat16), attention_backward(model, tokens, seq, torch.float32)
    return ("attention backward", *_interleaved({"native": bf, "through": bf, "fp32": f32}, rounds))


def train_step_ms(model: str, dtype: str, steps: int = 4) -> float:
    """The median measured step of a short `horizon train` run (its `plan vs measured` line)."""
    cmd = [sys.executable, "-m", "horizon_sim.cli.main", "train", "--model", model, "--steps", str(steps),
           "--batch", "4", "--seq", "128", "--compute-dtype", dtype, "--no-progress", "--eval-batches", "0"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    for line in r.stdout.splitlines() + r.stderr.splitlines():
        if line.startswith("plan vs measured"):
            return float(line.split("step ")[1].split(" ms")[0].replace(",", ""))
    raise SystemExit(f"horizon train --compute-dtype {dtype} printed no measured step (exit {r.returncode}):\n"
                     + r.stderr[-2000:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="preset or config path whose layer's GEMMs are timed (default tiny)")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per GEMM (batch x sequence, default 512)")
    ap.add_argument("--seq", type=int, default=128, help="sequence length of the attention row (default 128)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is printed (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ap.add_argument("--train", action="store_true", help="also time `horizon train --model tiny` a step in "
                    "fp32 and in bf16 (the CPU backend's GEMMs)")
    a = ap.parse_args(argv)
    for name, v in (("--tokens", a.tokens), ("--seq", a.seq), ("--rounds", a.rounds), ("--threads", a.threads)):
        if v < 1:
            ap.error(f"{name} {v}: must be at least 1")
    model = load_model(a.model)
    native = cpu_has_bf16_matmul()
    print(f"CPU bf16 matrix instructions: {'yes' if native else 'no'} (the CPU backend's bf16 GEMMs: "
          f"{'PyTorch kernel' if native else 'through fp32'}); {a.model}, {a.tokens} tokens, "
          f"{a.threads} thread(s), median of {a.rounds} interleaved round(s)")
    print(f"{'kernel':18s} {'shape':>18s} {'native bf16':>12s} {'bf16 via fp32':>14s} {'fp32':>8s} "
          f"{'native/via':>11s} {'via/fp32':>9s}")
    rows = gemm_rows(model, a.tokens, a.rounds, a.threads)
    for (name, n, t, f), ((sa, ta), (sb, tb)) in zip(rows, layer_gemms(model, a.tokens).values()):
        m, k = sa[::-1] if ta else sa
        shape = f"{m}x{k}x{sb[0] if tb else sb[1]}"
        print(f"{name:18s} {shape:>18s} {n:10.2f}ms {t:12.2f}ms {f:6.2f}ms {n / t:10.1f}x {t / f:8.2f}x")
    name, n, t, f = attn = attention_row(model, a.tokens, a.seq, a.rounds, a.threads)
    seq = min(a.seq, a.tokens)
    shape = f"{a.tokens // seq}x{seq}, {model.n_heads}/{model.n_kv_heads}h"
    print(f"{name:18s} {shape:>18s} {n:10.2f}ms {t:12.2f}ms {f:6.2f}ms {n / t:10.1f}x {t / f:8.2f}x")
    tot = [sum(r[i] for r in [*rows, attn]) for i in (1, 2, 3)]
    print(f"{'layer total':37s} {tot[0]:10.2f}ms {tot[1]:12.2f}ms {tot[2]:6.2f}ms "
          f"{tot[0] / tot[1]:10.1f}x {tot[1] / tot[2]:8.2f}x")
    if a.train:
        f32, b16 = train_step_ms("tiny", "fp32"), train_step_ms("tiny", "bf16")
        print(f"horizon train --model tiny --batch 4 --seq 128: step fp32 {f32:.1f} ms, bf16 {b16:.1f} ms "
              f"(bf16/fp32 {b16 / f32:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
