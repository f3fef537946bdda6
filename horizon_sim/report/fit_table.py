"""Report section 2, default vs tuned: for each model x GPU x RAM size of the config, the default
policy and the policy tune() finds from it, as fit_table.csv, fit_table.md and a summary
sentence (how many fit, the median speed-up where both fit)."""
import math
import statistics

import pandas as pd

from horizon_sim.plan.advice import policy_flags
from horizon_sim.plan.runner import Runner
from horizon_sim.plan.tune import tune
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import gib, md_table, pct, policy_text, ram_label, tps
from horizon_sim.report.out import Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.units import parse_size

FIT_COLS = [("model", "model", str, "l"), ("GPU", "gpu", str, "l"), ("RAM", "ram", str, "r"),
            ("policy", "policy", str, "l"), ("fits", "fits_text", str, "l"),
            ("tokens/s", "tokens_per_s", tps, "r"), ("MFU", "mfu", pct, "r"),
            ("bottleneck", "bottleneck", str, "l"), ("host GiB", "host_bytes", gib, "r"),
            ("device GiB", "device_peak_bytes", gib, "r"), ("tuned changes", "changes", str, "l")]


def fit_rows(cfg: BuildConfig, runner: Runner) -> list[dict]:
    """Two rows (default, tuned) per model x GPU x RAM size."""
    rows = []
    for name in cfg.table_models:
        model = load_model(name)
        for gpu in cfg.table_gpus:
            for ram in cfg.table_rams:
                hw = make_hardware(gpu, ram)
                base = cfg.table_policy
                d = runner.one(model, hw, base)
                tr = tune(model, hw, seq=base.seq, base=base, runner=runner)
                t = tr.table.iloc[0]  # the best that fits, else the nearest miss
                common = {"model": model.name, "params": model.total_params, "gpu": gpu, "ram": ram_label(ram),
                          "ram_bytes": parse_size(ram)}
                for kind, o_fits, why, vals, pol in (
                        ("default", d.fits(hw), d.why_not(hw),
                         (d.tokens_per_s, d.step_time_s, d.mfu, d.bottleneck, d.host_bytes, d.device_peak_bytes), base),
                        ("tuned", bool(t.fits), t.why_not,
                         (t.tokens_per_s, t.step_time_s, t.mfu, t.bottleneck, t.host_bytes, t.device_peak_bytes),
                         t.policy)):
                    tp, st, mfu, bn, hb, db = vals
                    rows.append({**common, "policy": kind, "fits": bool(o_fits),
                                 "fits_text": "yes" if o_fits else f"no: {why}",
                                 "tokens_per_s": float(tp) if o_fits else math.nan,
                                 "step_time_s": float(st) if o_fits else math.nan,
                                 "mfu": float(mfu) if o_fits else math.nan,
                                 "bottleneck": bn if o_fits else "-",
                                 "host_bytes": int(hb), "device_peak_bytes": int(db),
                                 "changes": "" if kind == "default" else (policy_flags(pol, base) or "none"),
                                 "batch": pol.batch, "micro_batches": pol.micro_batches, "act_ckpt_every": pol.act_ckpt_every,
                                 "slots": pol.slots, "act_ckpt_on": pol.act_ckpt_on, "optimizer": pol.optimizer,
                                 "working_copy": pol.working_copy, "grad_clip": pol.grad_clip})
    return rows


def build_fit_table(cfg: BuildConfig, out: Out, runner: Runner) -> Section:
    rows = fit_rows(cfg, runner)
    df = pd.DataFrame(rows)
    csv_cols = ["model", "params", "gpu", "ram", "ram_bytes", "policy", "fits", "tokens_per_s", "step_time_s",
                "mfu", "bottleneck", "host_bytes", "device_peak_bytes", "batch", "micro_batches", "act_ckpt_every",
                "slots", "act_ckpt_on", "optimizer", "working_copy", "grad_clip", "changes"]
    df[csv_cols].to_csv(out.path("fit_table.csv"), index=False, float_format="%.6g")
    shown = [{**r, "changes": f"`{r['changes']}`" if r["changes"] not in ("", "none") else r["changes"]}
             for r in rows]
    table = md_table(shown, FIT_COLS)
    out.text("fit_table.md", table + "\n")
    # the sentence, from the rows
    dflt = {(r["model"], r["gpu"], r["ram"]): r for r in rows if r["policy"] == "default"}
    tund = {(r["model"], r["gpu"], r["ram"]): r for r in rows if r["policy"] == "tuned"}
    n = len(dflt)
    n_d, n_t = sum(r["fits"] for r in dflt.values()), sum(r["fits"] for r in tund.values())
    ratios = {k: tund[k]["tokens_per_s"] / dflt[k]["tokens_per_s"] for k in dflt
              if dflt[k]["fits"] and tund[k]["fits"]}
    sent = f"Of {n} model x GPU x RAM configurations, {n_d} fit under the default policy and {n_t} under the tuned one"
    if ratios:
        kmax = max(ratios, key=ratios.get)
        sent += (f"; where both fit, tuning raises tokens/s by a median {statistics.median(ratios.values()):.1f}x "
                 f"(up to {ratios[kmax]:.1f}x for {kmax[0]} on {kmax[1]} with {kmax[2]}), mostly through a bigger "
                 f"batch ({statistics.median(tund[k]['batch'] for k in ratios):.0f} sequences, median, vs "
                 f"{cfg.table_policy.batch})")
    never = [k for k in dflt if not tund[k]["fits"]]
    if never:
        sent += ("; " + ", ".join(f"{m} on {g} with {r}" for m, g, r in never)
                 + " fit" + ("s" if len(never) == 1 else "") + " under no policy tune tries at fp32 moments and clip "
                 f"{cfg.table_policy.grad_clip:g} (see `fits` for what is short)")
    sent += "."
    body = (f"Default policy: {policy_text(cfg.table_policy)}. Tuned: `tune` from it (same precision and "
            f"clipping), batch capped at 64 sequences. Empty tokens/s: does not fit (the column says what is "
            f"short; host and device GiB are what the policy needs).\n\n{sent}\n\n{table}\n\n"
            "Files: [`fit_table.csv`](fit_table.csv), [`fit_table.md`](fit_table.md).")
    title = (f"{' / '.join(cfg.table_models)} on {' and '.join(cfg.table_gpus)}: default vs tuned policy")
    return Section(title, body, {"configs": n, "fit_default": n_d, "fit_tuned": n_t,
                                 "median_speedup": statistics.median(ratios.values()) if ratios else None,
                                 "rows": len(rows)})
