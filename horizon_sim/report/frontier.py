"""Report section 13, the frontier open MoE models (planned): gpt-oss-120b on one GPU box and
DeepSeek-V3 across H200 nodes, side by side with the ZeRO-3 offload peer where the peer's model
applies (one device). Per row: does it fit, how fast, the host bytes, what limits it, and what
RAM (or disk) it takes."""
import argparse
from dataclasses import replace

import pandas as pd

from horizon_sim.cli.hardware_args import with_disk
from horizon_sim.errors import HorizonError
from horizon_sim.peer.compare import plan_zero3, zero3_like
from horizon_sim.plan import plan
from horizon_sim.plan.advice import nearest_fit, policy_flags
from horizon_sim.plan.max_model import disk_lower_bound
from horizon_sim.plan.min_ram import min_ram
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import md_table, tps
from horizon_sim.report.out import Out, Section
from horizon_sim.schedule.op import Layout
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model

TiB = 2**40


def _need_TiB(model, hw, pol) -> float:
    """`horizon min-ram` per node for the row's policy (nan when the device is short)."""
    try:
        return min_ram(model, hw, pol).ram_bytes / TiB
    except HorizonError:
        return float("nan")


def _row(model, hw, pol, base, system: str, where: str, result=None) -> dict:
    """One row: `result` (the plan of model on hw under pol; planned here when not given)."""
    s = (result or plan(model, hw, pol)).summary
    return {"model": model.name, "machine": where, "system": system, "flags": policy_flags(pol, base) or "(default)",
            "fits": s.fits, "tokens_per_s": s.tokens_per_s, "host_TiB": s.host_bytes / TiB, "limit": s.bottleneck,
            "ram_needed_TiB": _need_TiB(model, hw, pol), "disk_TiB": disk_lower_bound(model, pol) / TiB}


def _peer_row(model, hw, base, where: str) -> dict:
    s = plan_zero3(model, hw, zero3_like(base)).summary
    return {"model": model.name, "machine": where, "system": "ZeRO-3 offload", "flags": "", "fits": s.fits,
            "tokens_per_s": s.tokens_per_s, "host_TiB": s.host_bytes / TiB, "limit": s.bottleneck,
            "ram_needed_TiB": float("nan"), "disk_TiB": 0.0}


def _box_rows(name: str, gpu: str, ram: str, base) -> list[dict]:
    """One GPU box: the default policy, the nearest one that fits when it does not, the peer."""
    model, hw = load_model(name), make_hardware(gpu, ram)
    where = f"{gpu} + {ram}"
    rows = [_row(model, hw, base, base, "Horizon", where)]
    if not rows[0]["fits"]:
        nf = nearest_fit(model, hw, base)
        if nf is not None:
            rows.append(_row(model, hw, nf.policy, base, "Horizon (nearest fit)", where))
    return rows + [_peer_row(model, hw, base, where)]


def _node_rows(name: str, gpu: str, ram: str, per_node: int, nodes: tuple, lean, base, disk) -> list[dict]:
    """Data parallel over nodes of `per_node` GPUs (the policy `lean`), and one GPU with the disk
    tier on a drive of disk = (size, GB/s); the peer on one GPU of the node."""
    model = load_model(name)
    rows = [_row(model, make_hardware(gpu, ram, layout=Layout(per_node, n)), lean, base, "Horizon",
                 f"{n} x ({per_node} {gpu} + {ram})") for n in nodes]
    hw = with_disk(make_hardware(gpu, ram), argparse.Namespace(disk=disk[0], disk_GBps=disk[1]))
    tiered = replace(lean, disk_tier="moments+low", states_dtype="fp32")
    rows.append(_row(model, hw, tiered, base, "Horizon (disk tier)", f"{gpu} + {ram} + {disk[0]} NVMe at {disk[1]} GB/s"))
    return rows + [_peer_row(model, make_hardware(gpu, ram), base, f"{gpu} + {ram}")]


def _lora_rows(boxes, pol, base) -> list[dict]:
    """LoRA on a frozen base, one row per (model, GPU, RAM, base form); the flags against `base`."""
    rows = []
    for name, gpu, ram, quant in boxes:
        lp = replace(pol, base_quant=quant)
        model, hw = load_model(name), make_hardware(gpu, ram)
        r = plan(model, hw, lp)
        rows.append({**_row(model, hw, lp, base, f"Horizon LoRA ({quant if lp.quantized_base else lp.compute_dtype} base)", f"{gpu} + {ram}", r),
                     "slot_GiB": r.schedule.meta.slot_bytes / 2**30})
    return rows


def build_frontier(cfg: BuildConfig, out: Out) -> Section:
    base, lean = cfg.frontier_policy, cfg.frontier_lean_policy
    rows = [r for name, gpu, ram in cfg.frontier_boxes for r in _box_rows(name, gpu, ram, base)]
    lora = _lora_rows(cfg.frontier_lora_boxes, cfg.frontier_lora_policy, base)
    rows += lora
    name, gpu, ram, per_node, nodes, disk = cfg.frontier_nodes
    rows += _node_rows(name, gpu, ram, per_node, nodes, lean, base, disk)
    pd.DataFrame(rows).to_csv(out.path("frontier.csv"), index=False, float_format="%.6g")
    yes = lambda f: "yes" if f else "**no**"  # noqa: E731
    num = lambda v: "-" if v != v else f"{v:,.2f}"  # noqa: E731
    table = md_table(rows, [("model", "model", str, "l"), ("machine", "machine", str, "l"),
                            ("system", "system", str, "l"), ("fits", "fits", yes, "l"),
                            ("tokens/s", "tokens_per_s", tps, "r"), ("host TiB", "host_TiB", num, "r"),
                            ("limit", "limit", str, "l"), ("RAM to buy TiB (per node)", "ram_needed_TiB", num, "r"),
                            ("disk TiB", "disk_TiB", lambda v: num(v) if v else "-", "r"),
                            ("flags", "flags", lambda f: f"`{f}`" if f else "", "l")])
    lean_flags = policy_flags(lean, base)
    text = (f"Planned, not measured on GPUs. Batch {base.batch} x {base.seq}. Both families are trained exactly on this "
            "machine (logits and every gradient equal transformers' on tiny configs: tests/test_gpt_oss.py, "
            "tests/test_deepseek.py). gpt-oss-120b is held dequantized (its hub checkpoint's MXFP4 experts are expanded "
            "on load), so its host bytes follow 117B parameters. DeepSeek-V3's rows run data parallel over nodes of "
            f"{per_node} GPUs with the lean policy `{lean_flags}`: each node keeps a whole bf16 working copy (1.2 TiB "
            "for 671B parameters) beside its shard of the master and moments, which is why no number of 1.5 TB nodes "
            "holds it; \"RAM to buy\" is `horizon min-ram` per node. The disk-tier row keeps the moments and the "
            "master's low halves on one NVMe drive (its speed an estimate: one PCIe Gen4 drive). The ZeRO-3 offload "
            "peer is modelled on one GPU, so its row is one GPU of the node. The LoRA rows adapt gpt-oss-120b as its "
            f"fine-tuning recipes do (`--lora-rank {cfg.frontier_lora_policy.lora_rank} --lora-targets "
            f"{cfg.frontier_lora_policy.lora_targets}`: peft's all-linear and the routed experts of three layers, "
            "docs/adapters.md), the base frozen on the host in bf16 (2 bytes a parameter) or nf4. Each block streams "
            f"into a device slot in the compute dtype (nf4 dequantized there): {max(r['slot_GiB'] for r in lora):.2f} "
            "GiB a slot here, two of them beside the step, which is what a card's memory must hold.\n\n" + table
            + "\n\nFile: [`frontier.csv`](frontier.csv).")
    return Section("The frontier open MoE models: gpt-oss-120b and DeepSeek-V3 (planned)", text, {"rows": rows})
