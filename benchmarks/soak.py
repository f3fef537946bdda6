"""Soak: 500 training steps of a tiny model through the executor; the process's resident
memory must not creep (issue 7: RSS at step 500 <= RSS at step 50 + 5%).

    .venv/bin/python benchmarks/soak.py [--steps 500] [--check-at 50]

Prints RSS (current VmRSS, not the peak) every 50 steps, the ratio, and PASS/FAIL.
The model is deliberately tiny (4 layers, hidden 64): a leak of per-step objects (timeline
rows, events, host staging, autograd graphs) shows up in proportion to steps, not to size."""
import argparse
import sys

import torch

from horizon_exec.procfs import rss_bytes
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--check-at", type=int, default=50)
    a = ap.parse_args()
    spec = ModelSpec(name="soak", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=172, vocab=256)
    pol = Policy(batch=2, seq=64, act_ckpt_every=2, slots=2, act_ckpt_on="host", optimizer="pipelined")
    gen = torch.Generator().manual_seed(0)
    at = {}
    with Trainer(spec, pol, TrainerConfig(optimizer=OptimizerConfig(lr=1e-3))) as tr:
        for step in range(1, a.steps + 1):
            tokens = torch.randint(0, spec.vocab, (pol.batch, pol.seq), generator=gen)
            res = tr.step(tokens)
            if step % 50 == 0 or step == a.check_at:
                at[step] = rss_bytes()
                print(f"step {step:4d}  loss {res.loss:.4f}  RSS {at[step] / 2**20:8.1f} MiB", flush=True)
        tr.flush()
    ratio = at[a.steps] / at[a.check_at]
    ok = ratio <= 1.05
    print(f"RSS step {a.steps} / step {a.check_at}: {ratio:.3f} (target <= 1.05) {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
