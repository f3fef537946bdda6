"""Benchmark: Horizon's executor against DeepSpeed ZeRO-3 offload on the same model, batch and cores
(issue 17), runs alternated, tokens/s side by side.

Horizon: its CPU backend as `horizon train` runs it: its cores as --compute-threads says (default
auto: the planner's split for the step; the row's label and a 'cores:' line say what was chosen);
its policy the planner's choice for each model on this machine, as `horizon train` without
policy flags makes it (priced with --hardware FILE, else this machine's calibration or a quick
estimate), each knob flag given (--keep-activations, --micro-batches, --act-ckpt-every, ...)
pinning its field, --no-search for Policy's defaults; a line per model says what ran; `horizon
train`'s compute dtype for this CPU on both sides (--compute-dtype; bf16 only with bf16 matrix
instructions). DeepSpeed 0.19.8: ZeRO-3 with
parameters and optimizer offloaded to CPU on its CPU accelerator, a transformers model from the
same ModelSpec, with transformers' per-layer activation checkpointing and without it, at 2 torch threads (both cores for its math, its best
here) and at 1. Each round runs Horizon, then DeepSpeed at each thread count; the figure of each
is the median over rounds of its median step. The models are validate's `base` and `wide_after`
shapes at their batch (2 x 256), not chosen for a result.

Run: .venv/bin/python benchmarks/vs_deepspeed.py [--rounds 3] [--steps 4] [--models base,wide]

Measured here before the core split (2026-11-25, AVX-512 2-core VM, 3 rounds; Horizon's compute on
1 core, its lanes on the other): Horizon 246 ms (base) and 410 ms (wide) per step; DeepSpeed's
best with checkpointing 278 / 385 ms (1.13x / 0.94x), its best overall (checkpointing off) 239 / 255 ms (0.97x / 0.62x). On a CPU "device" there is no link to hide
and DeepSpeed's math gets both cores where Horizon's compute lane has one (docs/zero3_peer.md).
Measured 2026-11-28 with --keep-activations all, compute on both cores (the core split), bf16
on both sides (a 2-core VM with AMX bf16), 5 rounds: Horizon 139 / 213 ms; DeepSpeed's best with
checkpointing 288 / 382 ms (2.07x / 1.79x), its best overall 222 / 306 ms (1.59x / 1.43x). The
same VM before op temporaries were tracked once (3 rounds): 183 / 265 ms, 1.22x / 1.19x.
"""
import argparse
import statistics as st
import sys

from horizon_exec.measure.peer_deepspeed import deepspeed_available, run_deepspeed_job, run_request
from horizon_exec.measure.probe import probe
from horizon_exec.measure.validate.configs import CONFIGS
from horizon_sim.peer.zero3_policy import Zero3Policy

from horizon_flags import add_horizon_flags, hardware_of, horizon_side

MODELS = {"base": CONFIGS[0].model, "wide": next(c.model for c in CONFIGS if c.name == "wide_after")}
TARGET = 1.3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds (default 3)")
    ap.add_argument("--steps", type=int, default=4, help="measured steps per run, after 2 warm-up steps (default 4)")
    ap.add_argument("--models", default="base,wide", help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    add_horizon_flags(ap)
    a = ap.parse_args()
    hw = hardware_of(a)
    if deepspeed_available() is None:
        print("DeepSpeed is not installed: make setup installs deepspeed==0.19.8", file=sys.stderr)
        return 2
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    bad = [n for n in names if n not in MODELS]
    if bad:
        print(f"--models: unknown {', '.join(bad)}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    side = horizon_side(a, batch=a.batch, seq=a.seq)
    print(f"--compute-threads {a.compute_threads}; both sides compute in {side.policy.compute_dtype} ({side.dtype_why})")
    tokens = a.batch * a.seq
    print(f"batch {a.batch} x {a.seq} ({tokens} tokens/step), {a.rounds} alternated rounds of {a.steps} steps; "
          "tokens/s from the median step")
    print(f"{'model':<7}{'params':>8}  {'run':<34}{'step ms':>9}{'tok/s':>8}{'Horizon x':>11}")
    for name in names:
        model = MODELS[name]
        pol, why = side.policy_for(model)
        print(f"{name}: {why}")
        horizon = "Horizon"
        runs = {horizon: []}
        peer = [(th, ck) for th in (2, 1) for ck in (True, False)]
        for th, ck in peer:
            runs[_label(th, ck)] = []
        for r in range(a.rounds):
            res = probe(model, pol, steps=a.steps, warmup=2, compute_threads=a.compute_threads, hardware=hw)
            if r == 0:  # the split is the planner's for the step: the same every round
                print(f"  {name} cores: {res['split_why'] or res['compute_threads']}", file=sys.stderr)
                label = f"Horizon ({res['compute_threads']} compute thread(s))"
                runs = {label: runs.pop(horizon), **runs}
                horizon = label
            runs[horizon].append(st.median(s["step_s"] for s in res["steps"]))
            for th in (2, 1):
                reqs = [run_request(model, Zero3Policy(batch=a.batch, seq=a.seq, act_ckpt=ck,
                                                           compute_dtype=pol.compute_dtype), steps=a.steps,
                                    warmup=2) for ck in (True, False)]
                job = run_deepspeed_job({"runs": reqs}, th, f"DeepSpeed {name}")
                for ck, out in zip((True, False), job["runs"]):
                    runs[_label(th, ck)].append(st.median(s["step_s"] for s in out["steps"]))
            print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1] * 1e3:.0f} ms" for k, v in runs.items()),
                  file=sys.stderr)
        ours = st.median(runs[horizon])
        best_ck = min(st.median(runs[_label(th, True)]) for th in (2, 1))
        best_any = min(st.median(v) for k, v in runs.items() if not k.startswith("Horizon"))
        for k, v in runs.items():
            step = st.median(v)
            print(f"{name:<7}{model.total_params / 1e6:7.1f}M  {k:<34}{step * 1e3:9.1f}{tokens / step:8,.0f}"
                  f"{step / ours:10.2f}x")
        print(f"{name}: Horizon vs DeepSpeed's best with checkpointing {best_ck / ours:.2f}x, vs its best overall "
              f"{best_any / ours:.2f}x (target {TARGET}x: {'met' if best_any / ours >= TARGET else 'NOT met'})")
    return 0


def _label(threads: int, act_ckpt: bool) -> str:
    return f"DeepSpeed (ckpt {'on' if act_ckpt else 'off'}, {threads} thread{'s' if threads > 1 else ''})"


if __name__ == "__main__":
    sys.exit(main())
