"""Report section 8, host bytes per parameter (planned): one model on one machine under each
host-memory policy (the fp32 master whole or split, the bf16 master, bf16 moments, no working
copy, the disk tier), and the largest model each exact-fp32 policy set trains there (max-model)."""
import argparse
from dataclasses import replace

import pandas as pd

from horizon_sim.cli.hardware_args import with_disk
from horizon_sim.plan import plan
from horizon_sim.plan.advice import BOUNDED_HOST_GRADS, policy_flags
from horizon_sim.plan.max_model import POLICY_CHANGES, exact_sets, max_model
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import md_table, tps
from horizon_sim.report.out import Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.units import fmt_bytes

_C = POLICY_CHANGES  # max-model's named policies; 'split-lean' = the split master in backward, host grads bounded
POLICIES = (  # (name, exact fp32 AdamW?, changes to the base policy)
    ("fp32 master", True, dict(split_master=False)),  # the default before the split master
    ("split master (default)", True, _C["split"]),
    ("no working copy, backward", True, dict(_C["lean"], max_host_grads=BOUNDED_HOST_GRADS)),
    ("split master, backward", True, _C["split-lean"]),
    ("bf16 master", False, dict(master_dtype="bf16", working_copy=False, split_master=False)),
    ("bf16 moments, backward", False, dict(_C["split-lean"], states_dtype="bf16")),
    ("split master, backward, moments on disk", True, _C["split-disk"]),
    ("split master, backward, moments and low halves on disk", True, _C["split-disk-low"]),
)


def build_host_bytes(cfg: BuildConfig, out: Out) -> Section:
    model = load_model(cfg.host_model)
    hw = make_hardware(cfg.host_gpu, cfg.host_ram)
    hw_disk = with_disk(hw, argparse.Namespace(disk=cfg.host_disk, disk_GBps=cfg.host_disk_GBps))
    base, n = cfg.host_policy, model.total_params
    rows = []
    for name, exact, kw in POLICIES:
        pol = replace(base, **kw)
        s = plan(model, hw_disk if pol.disk_tier != "none" else hw, pol).summary
        rows.append({"policy": name, "exact": exact, "flags": policy_flags(pol, base) or "(default)", "fits": s.fits,
                     "host_bytes_per_param": s.host_bytes / n, "disk_bytes_per_param": s.memory.disk_need_bytes / n,
                     "tokens_per_s": s.tokens_per_s, "bottleneck": s.bottleneck})
    pd.DataFrame(rows).to_csv(out.path("host_bytes.csv"), index=False, float_format="%.6g")
    yes = lambda f: "yes" if f else "no"  # noqa: E731
    table = md_table(rows, [("policy", "policy", str, "l"), ("exact fp32 AdamW", "exact", yes, "l"),
                            ("fits", "fits", yes, "l"),
                            ("host B/param", "host_bytes_per_param", lambda v: f"{v:.2f}", "r"),
                            ("disk B/param", "disk_bytes_per_param", lambda v: f"{v:.2f}" if v else "", "r"),
                            ("tokens/s", "tokens_per_s", tps, "r"), ("bottleneck", "bottleneck", str, "l"),
                            ("flags", "flags", lambda f: f"`{f}`", "l")])
    mm_rows = []
    if cfg.host_max_model:
        for name, pols in exact_sets(base).items():
            r = max_model(hw_disk if name == "+ disk" else hw, policies=pols)
            o = r.best.outcome
            mm_rows.append({"policies": name, "model": r.model.name, "params_B": r.params / 1e9,
                            "policy": r.best.policy_name, "tokens_per_s": o.tokens_per_s,
                            "host_bytes_per_param": o.host_bytes / r.params,
                            "disk_bytes_per_param": o.disk_bytes / r.params})
        ref = mm_rows[0]["params_B"]
        for r in mm_rows:
            r["ratio"] = r["params_B"] / ref
        pd.DataFrame(mm_rows).to_csv(out.path("host_bytes_max_model.csv"), index=False, float_format="%.6g")
    mm_table = md_table(mm_rows, [("exact-fp32 policies", "policies", str, "l"), ("largest model", "model", str, "l"),
                                  ("params", "params_B", lambda v: f"{v:.1f}B", "r"),
                                  ("vs before", "ratio", lambda v: f"{v:.2f}x", "r"),
                                  ("policy", "policy", str, "l"), ("tokens/s", "tokens_per_s", tps, "r"),
                                  ("host B/param", "host_bytes_per_param", lambda v: f"{v:.2f}", "r"),
                                  ("disk B/param", "disk_bytes_per_param", lambda v: f"{v:.2f}" if v else "", "r")])
    body = (f"{model.name} ({n / 1e9:.1f}B) on one {cfg.host_gpu} with {fmt_bytes(hw.host.ram_GiB * 2**30)} of RAM "
            f"({fmt_bytes(hw.host_bytes_usable)} usable), batch {base.batch} x {base.seq}; the disk tier on "
            f"{cfg.host_disk} of NVMe at {cfg.host_disk_GBps} GB/s (estimate: four PCIe Gen4 drives striped). "
            "Host bytes include gradients, checkpoints, stages and the runtime; the split master holds the exact "
            "fp32 master as its bf16 working copy plus a 16-bit low half (`docs/host_memory.md`).\n\n" + table
            + ("\n\nThe largest model under exact fp32 AdamW (fp32 master and moments), max-model's candidates "
               "(presets, dense-120b scaled in depth and width):\n\n" + mm_table if mm_rows else "")
            + "\n\nFiles: [`host_bytes.csv`](host_bytes.csv)"
            + (", [`host_bytes_max_model.csv`](host_bytes_max_model.csv)." if mm_rows else "."))
    return Section("Host bytes per parameter (planned)", body, {"rows": rows, "max_model": mm_rows})
