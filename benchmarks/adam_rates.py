"""Benchmark: the host AdamW step's rate, Horizon's native kernel against DeepSpeedCPUAdam (the
ZeRO-offload optimizer) and torch's fused AdamW, on the same N parameters and threads (issue 18's
optimizer-rate item; issue 17's peer).

Each contestant updates N fp32 parameters from fp32 gradients with fp32 moments (DeepSpeed
0.19.8's step takes nothing else; Horizon's also reads bf16 gradients and writes a bf16 working
copy in the same pass, which the second Horizon row times), in a process of its own with T
torch/OpenMP threads, `--rounds` rounds alternating the contestants; each figure is the median
over rounds of the rounds' G params/s (10^9 parameters a second, one step of each after a
warm-up step). Rates are per step of the whole array (all parameters once).

Run: .venv/bin/python benchmarks/adam_rates.py [--params 16M] [--threads 1,2] [--rounds 3] [--steps 10]

Last, per thread count: the split master against Horizon's fp32-master kernel doing the same
work, interleaved step by step in one process (the paired ratio is what the 26-against-28 bytes
buy, free of the machine's drift; the fp32-master kernel is itself within a few percent of
DeepSpeedCPUAdam above).

The split master (`horizon_split`: the master as its bf16 working copy + a 16-bit low half, bf16
gradients) moves 26 bytes a parameter where the others move 28: it gains only where the bus, not
the core, is the limit. Figures: the issue-18 note of 2026-11-25 (this 2-core VM's second core and
bus are shared with other tenants: the 2-thread rates swing 1.6-3.2 G/s between rounds).
"""
import argparse
import json
import os
import statistics as st
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("horizon", "horizon_bf16_copy", "horizon_split", "torch_fused", "deepspeed")


def _child(kind: str, n: int, steps: int, threads: int) -> float:
    import time

    import torch
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    p = torch.randn(n, generator=g)
    grad = torch.randn(n, generator=g) * 1e-3
    m, v = torch.zeros(n), torch.zeros(n)
    if kind == "torch_fused":
        step = torch.zeros((), dtype=torch.float32)

        def run():
            step.add_(1)
            torch._fused_adamw_([p], [grad], [m], [v], [], [step], lr=1e-3, beta1=0.9, beta2=0.999,
                                weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    else:
        from horizon_exec.optim.adamw import AdamW
        opt, step = AdamW(kernel="native"), torch.zeros((), dtype=torch.float32)
        wc = torch.empty(n, dtype=torch.bfloat16) if kind == "horizon_bf16_copy" else None
        gr = grad.to(torch.bfloat16) if kind == "horizon_bf16_copy" else grad

        if kind == "horizon_split":  # the master as its bf16 copy + low half, bf16 gradients
            from horizon_exec.optim.split import split_
            hi, lo = torch.empty(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.int16)
            split_(p, hi, lo)
            del p
            gr = grad.to(torch.bfloat16)

            def run():
                opt.step_split(hi, lo, gr, m, v, step)
        else:
            def run():
                opt.step(p, gr, m, v, step, working_copy=wc)
    run()  # warm-up: builds or loads the op, faults the moments in
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    return n * steps / (time.perf_counter() - t0) / 1e9


def _interleaved(n: int, steps: int, threads: int) -> dict:
    """The split master against the fp32 master with its bf16 copy (the same work: bf16
    gradients in, bf16 working copy out; 26 bytes a parameter against 28), one step of each in
    turn in one process, the order alternating: both see the same machine at the same moment."""
    import time

    import torch

    from horizon_exec.optim.adamw import AdamW
    from horizon_exec.optim.split import split_
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    p = torch.randn(n, generator=g)
    grad = (torch.randn(n, generator=g) * 1e-3).to(torch.bfloat16)
    hi, lo = torch.empty(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.int16)
    split_(p, hi, lo)
    opt, wc = AdamW(kernel="native"), torch.empty(n, dtype=torch.bfloat16)
    st1, st2 = (torch.zeros(n), torch.zeros(n), torch.zeros(())), (torch.zeros(n), torch.zeros(n), torch.zeros(()))
    whole = lambda: opt.step(p, grad, *st1, working_copy=wc)  # noqa: E731
    split = lambda: opt.step_split(hi, lo, grad, *st2)  # noqa: E731
    whole(), split()
    t = {"whole": [], "split": []}
    for i in range(2 * steps):
        for name, fn in ((("whole", whole), ("split", split)) if i % 2 == 0 else (("split", split), ("whole", whole))):
            t0 = time.perf_counter()
            fn()
            t[name].append(time.perf_counter() - t0)
    ratios = sorted(a / b for a, b in zip(t["whole"], t["split"]))
    return {"whole": n / st.median(t["whole"]) / 1e9, "split": n / st.median(t["split"]) / 1e9,
            "ratio": st.median(ratios), "q1": ratios[len(ratios) // 4], "q3": ratios[3 * len(ratios) // 4]}


def _measure(kind: str, n: int, steps: int, threads: int) -> float:
    if kind == "deepspeed":  # the peer's own timing, in its own child (peer_deepspeed.py)
        from horizon_exec.measure.peer_deepspeed import deepspeed_adam_Gparams_per_s
        return deepspeed_adam_Gparams_per_s(n, steps, threads)
    from horizon_exec.measure.child import child_env
    env = child_env({"OMP_NUM_THREADS": str(threads)})
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(n), str(steps), str(threads)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{kind}: failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return json.loads(lines[-1])["Gparams_per_s"]


def _count(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, n, steps, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        if kind == "interleaved":
            print(json.dumps(_interleaved(n, steps, threads)))
        else:
            print(json.dumps({"Gparams_per_s": _child(kind, n, steps, threads)}))
        sys.stdout.flush()
        os._exit(0)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="16M", help="parameters updated per step (default 16M)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    try:
        n, threads = _count(a.params), [int(t) for t in a.threads.split(",")]
    except ValueError:
        print(f"--params {a.params!r} / --threads {a.threads!r}: numbers like 16M and 1,2", file=sys.stderr)
        return 2
    from horizon_exec.measure.peer_deepspeed import deepspeed_available
    kinds = [k for k in KINDS if k != "deepspeed" or deepspeed_available()]
    print(f"AdamW step over {n:,} fp32 parameters (fp32 grads and moments), {a.rounds} alternated rounds "
          f"of {a.steps} steps; G params/s, median over rounds")
    for t in threads:
        rates = {k: [] for k in kinds}
        for _ in range(a.rounds):
            for k in kinds:
                rates[k].append(_measure(k, n, a.steps, t))
        med = {k: st.median(v) for k, v in rates.items()}
        ref_key = "deepspeed" if "deepspeed" in med else "torch_fused"
        ref_name = "DeepSpeedCPUAdam" if ref_key == "deepspeed" else "torch fused"
        print(f"threads {t}:  (x: the median over rounds of each round's ratio to {ref_name}, measured "
              "seconds apart: a shared machine's speed drifts more between rounds than within one)")
        for k in kinds:
            paired = [x / y for x, y in zip(rates[k], rates[ref_key])]
            print(f"  {k:<20}{med[k]:7.2f} G params/s  {st.median(paired):5.2f}x {ref_name} "
                  f"(rounds {min(paired):.2f}-{max(paired):.2f})   rates {', '.join(f'{x:.2f}' for x in rates[k])}")
        from horizon_exec.measure.child import child_env
        out = subprocess.run([sys.executable, __file__, "--child", "interleaved", str(n), str(3 * a.steps), str(t)],
                             capture_output=True, text=True, env=child_env({"OMP_NUM_THREADS": str(t)}), cwd=ROOT,
                             timeout=900)
        if out.returncode == 0:
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"  interleaved in one process, {3 * a.steps} steps each in turn: split master {r['split']:.2f} "
                  f"G params/s vs fp32 master + bf16 copy {r['whole']:.2f}: {r['ratio']:.3f}x per paired step "
                  f"(quartiles {r['q1']:.3f}-{r['q3']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
