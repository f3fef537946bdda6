"""Report section 12, adapters on a streamed frozen base (planned): the largest model each
machine adapts with LoRA (rank 16 on every projection, bf16 base) against the largest it fully
fine-tunes, and that model's speed under LoRA against full fine-tuning. A frozen base needs no master, no
moments and no host optimizer: host RAM falls from 12-16 to about 2 bytes a parameter, the link
carries weights one way, and the backward skips the base's weight gradients."""
import pandas as pd

from horizon_sim.plan.max_model import judge, max_model
from horizon_sim.plan.runner import Runner
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import md_table, tps
from horizon_sim.report.out import Out, Section
from horizon_sim.specs.hardware_presets import make_hardware


def _case(gpu: str, ram: str, lora_policy, full_policy, workers) -> dict:
    hw = make_hardware(gpu, ram)
    lora = max_model(hw, base=lora_policy, workers=workers)
    full = max_model(hw, base=full_policy, policies="lean", workers=workers)
    with Runner(workers) as runner:  # full fine-tuning's largest model under the same adapters
        same = judge(full.model, hw, {"lora": lora_policy}, runner)
    o, f = lora.best.outcome, full.best.outcome
    pre = lora.largest_preset
    return {"gpu": gpu, "ram": ram, "lora_model": lora.model.name, "lora_B": lora.params / 1e9,
            "lora_tokens_per_s": o.tokens_per_s, "lora_host_GiB": o.host_bytes / 2**30,
            "lora_device_GiB": o.device_peak_bytes / 2**30, "lora_limit": o.bottleneck,
            "lora_preset": pre.candidate.model.name if pre else "", "lora_preset_B": pre.candidate.params / 1e9 if pre else 0.0,
            "lora_preset_tokens_per_s": pre.outcome.tokens_per_s if pre else float("nan"),
            "full_model": full.model.name, "full_B": full.params / 1e9, "full_tokens_per_s": f.tokens_per_s,
            "full_policy": full.best.policy_name,
            "same_lora_tokens_per_s": same.outcome.tokens_per_s,
            "same_lora_speedup": same.outcome.tokens_per_s / f.tokens_per_s}


def build_adapters(cfg: BuildConfig, out: Out, workers: int | None = None) -> Section:
    lp, fp = cfg.adapters_policy, cfg.adapters_full_policy
    rows = [_case(gpu, ram, lp, fp, workers) for gpu, ram in cfg.adapters_machines]
    pd.DataFrame(rows).to_csv(out.path("adapters.csv"), index=False, float_format="%.6g")
    b = lambda v: f"{v:.1f}"  # noqa: E731
    table = md_table(rows, [
        ("GPU", "gpu", str, "l"), ("RAM", "ram", str, "r"),
        ("LoRA: largest model", "lora_model", str, "l"), ("B", "lora_B", b, "r"),
        ("tokens/s", "lora_tokens_per_s", tps, "r"), ("host GiB", "lora_host_GiB", lambda v: f"{v:,.0f}", "r"),
        ("limit", "lora_limit", str, "l"), ("largest preset", "lora_preset", str, "l"),
        ("its tokens/s", "lora_preset_tokens_per_s", tps, "r"),
        ("full FT: largest model", "full_model", str, "l"), ("B", "full_B", b, "r"),
        ("tokens/s", "full_tokens_per_s", tps, "r"),
        ("that model under LoRA: tokens/s", "same_lora_tokens_per_s", tps, "r"),
        ("x full FT", "same_lora_speedup", lambda v: f"{v:.2f}x", "r")])
    text = (f"Planned, not measured on GPUs. LoRA rank {lp.lora_rank} on {lp.lora_targets} (the attention and MLP "
            f"projections of every block), the base frozen in {lp.compute_dtype} on the host; batch {lp.batch} x "
            f"{lp.seq}. Full fine-tuning is max-model's lean policy set (the fastest that fits). Candidates are the "
            "dense presets and dense-120b scaled in depth and width (`horizon max-model`). The executor runs "
            "adapters on this machine (loss and every adapter gradient equal peft's on transformers, "
            "tests/test_lora_exec.py); a 4-bit base is not planned yet.\n\n" + table
            + "\n\nCommands: `horizon max-model --gpu GPU --ram RAM --lora-rank 16` and `horizon max-model --gpu "
              "GPU --ram RAM`. File: [`adapters.csv`](adapters.csv).")
    return Section("Adapters on a frozen base: the largest model per machine (planned)", text, {"rows": rows})
