"""Report section 11, mixture-of-experts (planned): the questions users ask of Qwen3-MoE and
Mixtral on one GPU box. Host RAM holds every expert (its bytes follow the total parameters); the
GPU computes the router and the experts each token is sent to (MFU counts those active
parameters). Per case: does it fit, how fast, what limits it, and how much RAM it needs."""
import argparse
from dataclasses import replace

import pandas as pd

from horizon_sim.cli.hardware_args import with_disk
from horizon_sim.errors import HorizonError
from horizon_sim.plan import plan
from horizon_sim.plan.advice import policy_flags
from horizon_sim.plan.min_ram import min_ram
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import md_table, tps
from horizon_sim.report.out import Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model


def _row(name: str, gpu: str, ram: str, disk: tuple | None, pol, base) -> dict:
    model = load_model(name)
    hw = make_hardware(gpu, ram)
    if disk:
        hw = with_disk(hw, argparse.Namespace(disk=disk[0], disk_GBps=disk[1]))
    s = plan(model, hw, pol).summary
    try:
        need = min_ram(model, hw, pol).ram_bytes / 2**30
    except HorizonError:
        need = float("nan")  # the device is short: no RAM size helps
    return {"model": name, "total_B": model.total_params / 1e9, "active_B": model.active_params / 1e9,
            "gpu": gpu, "ram": ram, "disk": f"{disk[0]} at {disk[1]} GB/s" if disk else "",
            "flags": policy_flags(pol, base) or "(default)", "fits": s.fits, "why": "" if s.fits else s.why,
            "tokens_per_s": s.tokens_per_s, "mfu_active": s.mfu, "bottleneck": s.bottleneck,
            "host_GiB": s.host_bytes / 2**30, "device_GiB": s.device_peak_bytes / 2**30, "ram_needed_GiB": need}


def build_moe(cfg: BuildConfig, out: Out) -> Section:
    base = cfg.moe_base_policy
    rows = [_row(name, gpu, ram, disk, replace(base, **kw), base) for name, gpu, ram, disk, kw in cfg.moe_cases]
    pd.DataFrame(rows).to_csv(out.path("moe.csv"), index=False, float_format="%.6g")
    yes = lambda f: "yes" if f else "**no**"  # noqa: E731
    table = md_table(rows, [("model", "model", str, "l"), ("total B", "total_B", lambda v: f"{v:.1f}", "r"),
                            ("active B", "active_B", lambda v: f"{v:.1f}", "r"), ("GPU", "gpu", str, "l"),
                            ("RAM", "ram", str, "r"), ("disk", "disk", str, "l"), ("fits", "fits", yes, "l"),
                            ("tokens/s", "tokens_per_s", tps, "r"),
                            ("MFU (active)", "mfu_active", lambda v: f"{v:.1%}", "r"),
                            ("limit", "bottleneck", str, "l"), ("host GiB", "host_GiB", lambda v: f"{v:,.0f}", "r"),
                            ("RAM to buy GiB", "ram_needed_GiB", lambda v: "-" if v != v else f"{v:,.0f}", "r"),
                            ("flags", "flags", lambda f: f"`{f}`", "l")])
    text = (f"Planned, not measured on GPUs. Batch {base.batch} x {base.seq}. Host RAM holds every expert, so its "
            "bytes follow the total parameters; the GPU computes the router and the experts each token is sent to, "
            "so MFU counts the active parameters (attention, router, the top-k experts; the busiest expert's load "
            "from a balanced router's expected skew). Every expert crosses the link each pass. \"RAM to buy\" is "
            "`horizon min-ram` for the row's policy. The executor runs these families on this machine (logits and "
            "gradients equal transformers', the router's load-balancing loss included when a config asks for it; the "
            "presets' configs leave it off).\n\n" + table
            + "\n\nFile: [`moe.csv`](moe.csv).")
    return Section("Mixture-of-experts on one GPU (planned)", text, {"rows": rows})
