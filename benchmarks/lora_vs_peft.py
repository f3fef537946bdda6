"""Benchmark: Horizon's LoRA step (adapters on a streamed frozen base, `horizon train --lora-rank R`)
against peft's LoRA on plain autograd: the same model, batch, loss and cores, timed in one run.

Model: Llama-style, 8 layers, hidden 512, 8 heads, SwiGLU 1376, vocab 32000 (Llama-2's), one step
= 4 x 512 tokens; LoRA rank 16, alpha 32 on all-linear (every projection of the blocks: peft's
"all-linear", the LM head left out), the rank and alpha most LoRA recipes start from. It is
exec_vs_autograd.py's default shape, taken as it is (a CPU step of a few seconds), not picked or
tuned to flatter either side. At hidden 512 the frozen 32000-row head is ~40% of the GEMM FLOPs a
token costs (16M of 42M weights multiplied); both sides run it (a forward and an input gradient),
Horizon with its chunked fused loss, transformers on the full logits. Both sides hold the same
weights (Horizon's random base copied into the transformers model).
Horizon: a Trainer on the planner's policy for this model on this machine, as `horizon train
--lora-rank R` without policy flags chooses it (knob flags pin fields, --no-search for Policy's
defaults; the policy line says what ran), `horizon train`'s compute dtype for this CPU (bf16 where
it has bf16 matrix instructions: the base in bf16, the adapters, their gradients and AdamW in
fp32), clip 1.0, lr 1e-4, its cores as --compute-threads says (default auto; printed as 'cores:').
Baseline: transformers' LlamaForCausalLM of the same shape in the same compute dtype (bf16
weights, as a peft user loads with dtype=torch.bfloat16), wrapped by peft's get_peft_model
(LoraConfig(r, lora_alpha, target_modules, lora_dropout=0)), which keeps the adapters in fp32
(autocast_adapter_dtype, its default) and casts their input to fp32: no torch.autocast, so the
adapters' GEMMs run in fp32 on both sides; no gradient checkpointing (the model fits: its fastest
case); torch.optim.AdamW(fused=True) on the adapters, clip_grad_norm_ 1.0, loss = transformers'
token-mean cross-entropy on the next token (Horizon's loss). It runs on exactly Horizon's compute
cores with as many intra-op threads (exec_vs_autograd.py's AutogradStep: all the cores whenever
the split gives Horizon's compute all of them), so neither side gets more cores for its math.

Prints (medians of the timed steps after warm-up; the two sides alternate within each round,
each going first in turn, so load from elsewhere hits both alike):
  horizon: median ms, tokens/s    the whole Trainer.step call (the engine's own step_s beside it)
  peft:    median ms, tokens/s    forward, backward, clip and AdamW step
  ratio horizon/peft: X.XX        peft step time / Horizon step time (higher = Horizon faster), of
                                  the medians; beside it the rounds' own ratios (median, range)
and each side's RSS: what building it and one untimed step (or forward) added, and the largest
step's peak above the RSS it started from (VmHWM reset per step); both sides live in one process,
so these are approximate.
Run: .venv/bin/python benchmarks/lora_vs_peft.py [--quick] [--steps 9] [--rank 16] [--targets q_proj,v_proj]
"""
import argparse
import statistics
import time
import warnings

import torch
import torch.nn as nn
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM  # noqa: F401 (imported before any RSS is counted)

from horizon_exec.model.hf import copy_to_hf, hf_model
from horizon_exec.procfs import rss_bytes, vm_hwm_bytes
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec

from exec_vs_autograd import AutogradStep, _config
from horizon_flags import add_shape_flags, add_horizon_flags, horizon_side


class _LossOf(nn.Module):
    """tokens -> the peft model's next-token loss (what AutogradStep's model returns)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(input_ids=tokens, labels=tokens).loss


class PeftStep(AutogradStep):
    """AutogradStep (its cores, threads and timing) on the peft model, AdamW on the adapters."""

    def __init__(self, tr, targets):
        pol, b = tr.policy, tr.backend
        self.spec, self.pol, self.cores, self.threads = tr.model, pol, b.compute_cores, b.compute_threads
        self.bf16 = False  # no autocast: bf16 weights, fp32 adapters, as peft keeps them
        hf = hf_model(tr.model, dtype=torch.bfloat16 if pol.compute_dtype == "bf16" else torch.float32)
        copy_to_hf(tr, hf)  # the same base weights as Horizon's
        hf.config.use_cache = False
        tm = "all-linear" if targets == "all-linear" else targets.split(",")
        self.peft = get_peft_model(hf, LoraConfig(r=pol.lora_rank, lora_alpha=pol.lora_alpha, target_modules=tm,
                                                  lora_dropout=0.0))
        self.model = _LossOf(self.peft).train()
        self.trained = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.trained, lr=1e-4, fused=True)


def peak_above(fn):
    """(fn's result, RSS high-water mark during fn above the RSS at its start)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    rss0 = rss_bytes()
    out = fn()
    return out, vm_hwm_bytes() - rss0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_flags(ap)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--targets", default="all-linear", help="all-linear, or module names: q_proj,v_proj")
    ap.add_argument("--steps", type=int, default=9, help="timed steps per side")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2x128 model, 2 x 64 tokens, 3 steps")
    add_horizon_flags(ap)
    a = ap.parse_args()
    if a.quick:
        a.layers, a.hidden, a.heads, a.ffn, a.vocab = 2, 128, 4, 344, 1024
        a.batch, a.seq, a.steps, a.warmup = 2, 64, 3, 1
    spec = ModelSpec(name="bench-llama", n_layers=a.layers, hidden=a.hidden, n_heads=a.heads,
                     n_kv_heads=a.heads, ffn_hidden=a.ffn, vocab=a.vocab)
    side = horizon_side(a, batch=a.batch, seq=a.seq, lora_rank=a.rank, lora_alpha=a.alpha, lora_targets=a.targets,
                        optimizer="after")
    pol, why = side.policy_for(spec)
    print(why)
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
    tok = torch.randint(0, spec.vocab, (pol.batch, pol.seq))
    rss = rss_bytes()
    tr = Trainer(spec, pol, _config(a))
    with tr:
        first = tr.step(tok).loss  # untimed: the check below, and every buffer touched
        tr_rss, rss = rss_bytes() - rss, rss_bytes()
        peft = PeftStep(tr, a.targets)
        with torch.no_grad():
            ref = peft.model(tok).item()
        peft_rss = rss_bytes() - rss
        n_ad = [sum(x.numel() for x in xs) for xs in (tr.adapters.grads.values(), peft.trained)]
        print(f"model {spec.n_layers}x{spec.hidden} (ffn {spec.ffn_hidden}, vocab {spec.vocab}), "
              f"{spec.total_params / 1e6:.1f}M params, LoRA r {pol.lora_rank} alpha {pol.lora_alpha:g} on {a.targets} "
              f"(adapter params: horizon {n_ad[0] / 1e6:.2f}M, peft {n_ad[1] / 1e6:.2f}M), {pol.batch}x{pol.seq} "
              f"tokens/step, {pol.compute_dtype} compute ({side.dtype_why})")
        print(f"cores: {tr.backend.split_why}; Horizon compute threads {peft.threads} on cores "
              f"{sorted(peft.cores)}, host lanes on {sorted(tr.backend.host_cores)}; peft: {peft.threads} "
              f"intra-op threads on the same cores")
        print(f"same tokens, first loss: horizon {first:.4f}, peft {ref:.4f} (same weights; every adapter's B "
              "starts at 0)")

        def horizon_step():
            t0 = time.perf_counter()
            res = tr.step(torch.randint(0, spec.vocab, (pol.batch, pol.seq)))
            return time.perf_counter() - t0, res

        t = {"horizon": [], "engine": [], "peft": []}
        peak = {"horizon": 0, "peft": 0}
        for r in range(a.warmup + a.steps):
            for k in ("horizon", "peft")[::1 if r % 2 else -1]:
                out, hwm = peak_above(horizon_step if k == "horizon" else peft)
                if r < a.warmup:
                    continue
                peak[k] = max(peak[k], hwm)
                if k == "horizon":
                    (s, res) = out
                    t["horizon"].append(s)
                    t["engine"].append(res.step_s)
                else:
                    t["peft"].append(out)
    th, te, tp = (statistics.median(t[k]) for k in ("horizon", "engine", "peft"))
    tl = res.timeline
    ops = (tl.end_s - tl.start_s).groupby(tl.kind).sum().sort_values(ascending=False)
    print("horizon's last step, op time by kind: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in ops.items()))
    mib = 2 ** 20
    print(f"horizon: {th * 1e3:.1f} ms/step ({pol.tokens / th:,.0f} tok/s; engine step_s {te * 1e3:.1f} ms), "
          f"RSS added {tr_rss / mib:,.0f} MiB, step peak +{peak['horizon'] / mib:,.0f} MiB")
    print(f"peft:    {tp * 1e3:.1f} ms/step ({pol.tokens / tp:,.0f} tok/s), "
          f"RSS added {peft_rss / mib:,.0f} MiB, step peak +{peak['peft'] / mib:,.0f} MiB")
    rounds = sorted(p / h for p, h in zip(t["peft"], t["horizon"]))
    print(f"ratio horizon/peft: {tp / th:.2f}  (peft step time / Horizon step time, medians of {a.steps}; "
          f"higher = Horizon faster; per round: median {statistics.median(rounds):.2f}, "
          f"{rounds[0]:.2f}..{rounds[-1]:.2f})")


if __name__ == "__main__":
    main()
