"""Report section 12, adapters on a streamed frozen base (planned): the largest model each
machine adapts with LoRA (rank 16 on every projection; a bf16 base, and an nf4 one) against the largest it fully
fine-tunes, and that model's speed under LoRA against full fine-tuning. A frozen base needs no master, no
moments and no host optimizer: host RAM falls from 12-16 to about 2 bytes a parameter (0.55 in nf4), the link
carries weights one way, and the backward skips the base's weight gradients."""
from dataclasses import replace

import pandas as pd

from horizon_sim.plan.max_model import judge, max_model
from horizon_sim.plan.runner import Runner
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import md_table, tps
from horizon_sim.report.out import Out, Section
from horizon_sim.specs.hardware_presets import make_hardware


def _cases(gpu: str, ram: str, lora_policy, full_policy, bases, workers) -> list[dict]:
    """One row per base form (Policy.base_quant) on one machine; full fine-tuning planned once."""
    hw = make_hardware(gpu, ram)
    full = max_model(hw, base=full_policy, policies="lean", workers=workers)
    f = full.best.outcome
    rows = []
    for base in bases:
        lp = replace(lora_policy, base_quant=base)
        lora = max_model(hw, base=lp, workers=workers)
        with Runner(workers) as runner:  # full fine-tuning's largest model under the same adapters
            same = judge(full.model, hw, {"lora": lp}, runner)
        o, pre = lora.best.outcome, lora.largest_preset
        rows.append({
            "gpu": gpu, "ram": ram, "base": lp.base_quant if lp.quantized_base else lp.compute_dtype,
            "lora_model": lora.model.name,
            "lora_B": lora.params / 1e9, "lora_tokens_per_s": o.tokens_per_s, "lora_host_GiB": o.host_bytes / 2**30,
            "lora_device_GiB": o.device_peak_bytes / 2**30, "lora_limit": o.bottleneck,
            "lora_preset": pre.candidate.model.name if pre else "", "lora_preset_B": pre.candidate.params / 1e9 if pre else 0.0,
            "lora_preset_tokens_per_s": pre.outcome.tokens_per_s if pre else float("nan"),
            "full_model": full.model.name, "full_B": full.params / 1e9, "full_tokens_per_s": f.tokens_per_s,
            "full_policy": full.best.policy_name,
            "same_lora_tokens_per_s": same.outcome.tokens_per_s,
            "same_lora_speedup": same.outcome.tokens_per_s / f.tokens_per_s})
    return rows


def build_adapters(cfg: BuildConfig, out: Out, workers: int | None = None) -> Section:
    lp, fp = cfg.adapters_policy, cfg.adapters_full_policy
    rows = [r for gpu, ram in cfg.adapters_machines for r in _cases(gpu, ram, lp, fp, cfg.adapters_bases, workers)]
    pd.DataFrame(rows).to_csv(out.path("adapters.csv"), index=False, float_format="%.6g")
    b = lambda v: f"{v:.1f}"  # noqa: E731
    table = md_table(rows, [
        ("GPU", "gpu", str, "l"), ("RAM", "ram", str, "r"), ("base", "base", str, "l"),
        ("LoRA: largest model", "lora_model", str, "l"), ("B", "lora_B", b, "r"),
        ("tokens/s", "lora_tokens_per_s", tps, "r"), ("host GiB", "lora_host_GiB", lambda v: f"{v:,.0f}", "r"),
        ("limit", "lora_limit", str, "l"), ("largest preset", "lora_preset", str, "l"),
        ("its tokens/s", "lora_preset_tokens_per_s", tps, "r"),
        ("full FT: largest model", "full_model", str, "l"), ("B", "full_B", b, "r"),
        ("tokens/s", "full_tokens_per_s", tps, "r"),
        ("that model under LoRA: tokens/s", "same_lora_tokens_per_s", tps, "r"),
        ("x full FT", "same_lora_speedup", lambda v: f"{v:.2f}x", "r")])
    text = (f"Planned, not measured on GPUs. LoRA rank {lp.lora_rank} on {lp.lora_targets} (the attention and MLP "
            f"projections of every block), the base frozen on the host in {lp.compute_dtype}, or its blocks in "
            "nf4 (QLoRA's 4-bit format, dequantized on the device as each loads; the embedding and head in "
            f"{lp.compute_dtype}); batch {lp.batch} x "
            f"{lp.seq}. Full fine-tuning is max-model's lean policy set (the fastest that fits). Candidates are the "
            "dense presets and dense-120b scaled in depth and width (`horizon max-model`). The executor runs "
            "adapters on this machine (loss and every adapter gradient equal peft's on transformers, "
            "tests/test_lora_exec.py; on an nf4 base, equal to peft's QLoRA on bitsandbytes' quantized state, "
            "tests/test_quant_base.py).\n\n" + table
            + "\n\nCommands: `horizon max-model --gpu GPU --ram RAM --lora-rank 16 [--base-quant nf4]` and "
              "`horizon max-model --gpu GPU --ram RAM`. File: [`adapters.csv`](adapters.csv).")
    return Section("Adapters on a frozen base: the largest model per machine (planned)", text, {"rows": rows})
