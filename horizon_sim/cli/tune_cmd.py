"""`horizon tune`: the fastest policy that fits, and the Pareto front of speed against host RAM."""
import argparse
import json
import math

from horizon_sim.errors import HorizonError
from horizon_sim.cli.explicit_flags import given as explicit
from horizon_sim.cli.explicit_flags import record_explicit
from horizon_sim.cli.hardware_args import add_cluster_args, with_cluster
from horizon_sim.cli.policy_args import add_policy_args, fit_seq_to_positions, policy_from_args
from horizon_sim.schedule.op import PEERS
from horizon_sim.specs.hardware_presets import DEVICES, LINKS, make_hardware
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB, fmt_bytes
from horizon_sim.specs.moe import params_label

EXAMPLE = """example:
  horizon tune --model llama-3.1-70b --gpu h100-pcie --ram 1.5TB
  horizon tune --model qwen2.5-14b --gpu rtx-4090 --ram 256GiB --seq 4096 --top 5
  horizon tune --model dense-120b --gpu h200 --ram 1.5TB --grad-clip 0 --states-dtype bf16 --json

  horizon tune --model qwen2.5-14b --gpu h100-pcie --batch 16 --seq 4096 --act-ckpt-every 2

Each policy flag given pins its knob (--batch fixes the batch, --act-ckpt-every 2 keeps K=2) and
the search covers the rest, as `horizon train` without those flags does on its own machine;
--grad-clip 0 lets the search run the optimizer during backward (no exact clipping);
--max-batch caps sequences per step (bigger batches are almost always faster)."""


# ---- helpers shared by the search commands ---------------------------------------------------
def add_hardware_args(p: argparse.ArgumentParser, *, ram: bool = True) -> None:
    p.add_argument("--gpu", default="h100-sxm", help=f"device preset: {', '.join(DEVICES)} (default h100-sxm)")
    if ram:
        p.add_argument("--ram", default="512GiB", help="host RAM: 1TB, 1.5TB, 1024GiB, 512G (default 512GiB)")
    p.add_argument("--link", default=None, help=f"link preset: {', '.join(LINKS)} (default: the GPU's)")
    p.add_argument("--hardware", default=None, metavar="FILE.toml",
                   help="a hardware file (from `horizon calibrate` or hand-written); overrides --gpu/--link"
                        + ("/--ram" if ram else ""))
    add_cluster_args(p)


def hardware_from_args(a: argparse.Namespace):
    """The machine the flags describe, named with its layout when it has several devices (the
    search commands' headers say what was searched: '2 x 8 x h200 / ... per node')."""
    if a.hardware:
        from horizon_sim.specs.hardware_io import load_hardware
        hw = with_cluster(load_hardware(a.hardware), a)
    else:
        hw = with_cluster(make_hardware(a.gpu, getattr(a, "ram", None), a.link), a)
    c = hw.cluster
    if c.ranks > 1 and " per node" not in hw.name:
        from dataclasses import replace
        hw = replace(hw, name=f"{c.layout.nodes} x {c.layout.devices_per_node} x {hw.name or hw.device.name} per node")
    return hw


def machine_flags(a: argparse.Namespace, hw) -> str:
    """The flags that rebuild the machine a search ran on: the hardware, the layout and the disk
    (a printed command must plan what was searched, not one device of it)."""
    out = [f"--hardware {a.hardware}"] if a.hardware else [f"--gpu {a.gpu}"] + (
        [f"--ram {a.ram}"] if getattr(a, "ram", None) else []) + ([f"--link {a.link}"] if a.link else [])
    c = hw.cluster
    if c.ranks > 1 or a.gpus is not None or a.nodes is not None:
        out += [f"--gpus {c.layout.devices_per_node}", f"--nodes {c.layout.nodes}"]
    if a.cluster:
        out.append(f"--cluster {a.cluster}")
    if a.disk:
        out.append(f"--disk {a.disk}")
    if a.disk_GBps:
        out.append(f"--disk-GBps {a.disk_GBps}")
    return " ".join(out)


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=None, help="simulation processes (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")


def positive(name: str, v, allow_none: bool = False):
    if v is None and allow_none:
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise HorizonError(f"{name} {v!r} must be a positive integer")
    return v


def format_table(rows: list[dict], cols: list[tuple]) -> str:
    """cols: (header, key, formatter). Right-aligned text columns, two spaces apart."""
    cells = [[h for h, _, _ in cols]] + [[f(r[k]) for _, k, f in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells)


def jsonable(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, Policy):
            continue
        if hasattr(v, "item"):  # numpy scalars
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


def _gib(n) -> str:
    return fmt_bytes(n)


def _tps(v) -> str:
    return f"{v:,.0f}" if v == v else "-"


COLS = [("batch", "batch", str), ("micro", "micro_batches", lambda n: f"{n}x"), ("order", "mb_order", str),
        ("K", "act_ckpt_every", str), ("keep", "keep_last", lambda v: "all" if v == -1 else str(v)), ("slots", "slots", str), ("ckpt", "act_ckpt_on", str),
        ("optimizer", "optimizer", str), ("wcopy", "working_copy", lambda w: "on" if w else "off"),
        ("master", "split_master", lambda s: "split" if s else "fp32"),
        ("grads<=", "max_host_grads", lambda v: str(v) if v else "-"),
        ("tokens/s", "tokens_per_s", _tps), ("step s", "step_time_s", lambda v: f"{v:.2f}"),
        ("MFU", "mfu", lambda v: f"{v:.1%}"), ("device", "device_peak_bytes", _gib),
        ("host", "host_bytes", _gib), ("bottleneck", "bottleneck", str)]


ADAPTERS_AFTER = COLS[7]  # the optimizer's column: the adapters' place follows it
ADAPTERS_COL = ("adapters", "adapters_on", str)


def configure(p: argparse.ArgumentParser) -> None:
    p.description = ("Search batch, micro-batches, checkpoint interval K, device slots, checkpoint "
                     "placement, optimizer overlap, the host working copy, the split master, the kept layers and the micro-batch "
                     "order for the highest tokens/s that fits; print the top configurations and the Pareto "
                     "front of tokens/s against host RAM.")
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--model", default="llama-3.1-8b",
                   help="a preset name or a path to an HF config.json (default llama-3.1-8b)")
    add_hardware_args(p)
    p.add_argument("--max-batch", type=int, default=64,
                   help="most sequences per step when --batch is not given (default 64)")
    p.add_argument("--top", type=int, default=10, help="configurations to show (default 10)")
    p.add_argument("--compare", default=None, choices=PEERS,
                   help="also find the peer's fastest batch (DeepSpeed ZeRO-3 offload, or ZeRO-2 offload: "
                        "zero2-offload; with and without activation checkpointing) that fits, and show it beside "
                        "Horizon's best")
    p.add_argument("--peer-knobs", default=None, metavar="K=V,...",
                   help="the peer's fixed DeepSpeed knobs (see horizon plan --help)")
    from horizon_sim.job.cli import add_save_job_arg
    add_save_job_arg(p, "the best configuration (the top row)")
    add_run_args(p)
    add_policy_args(p, searched="")
    # --batch fixes the batch (only its splits are searched); not given: any batch up to --max-batch
    for act in p._actions:
        if act.dest == "batch":
            act.help = ("sequences per step, fixed (your training batch): only its splits into micro-batches "
                        "are searched (default: any batch up to --max-batch)")
    record_explicit(p)  # every policy flag given pins its knob (plan/pinned.py)


def run(a: argparse.Namespace) -> int:
    from horizon_sim.plan.tune import tune
    from horizon_sim.specs.hf_config import load_model

    from horizon_sim.plan.pinned import pinned_space
    given = explicit(a)
    positive("--seq", a.seq)
    positive("--top", a.top)
    positive("--max-batch", a.max_batch)
    positive("--batch", a.batch)
    positive("--workers", a.workers, allow_none=True)
    model, hw = load_model(a.model), hardware_from_args(a)
    fit_seq_to_positions(a, model)
    if a.save_job:
        from horizon_sim.job.cli import check_job_path
        check_job_path(a.save_job)  # before the search
    base = policy_from_args(a, hw)  # the flags given pin their fields; the search covers the other knobs
    fixed_batch = base.batch if "batch" in given else None
    space = pinned_space(base, given, n_layers=model.n_layers, batch=fixed_batch, max_batch=a.max_batch)
    if a.peer_knobs and not a.compare:
        raise HorizonError("--peer-knobs sets the compared peer's knobs: add --compare zero3-offload (or zero2-offload)")
    peer = zero3 = None
    if a.compare:
        from horizon_sim.peer.compare import parse_knobs, tune_zero3
        from horizon_sim.plan.families import peer as peer_family
        fam = peer_family(a.compare)
        knobs = parse_knobs(a.peer_knobs)
        fam.like(base, **knobs)  # a knob the family does not take: its one-line error, before the search
        if fam.name.value == "zero2-offload":
            knobs["offload_param"] = False
        peer, zero3 = tune_zero3(model, hw, a.seq, max_batch=fixed_batch or a.max_batch, grad_clip=base.grad_clip,
                                 knobs=knobs)
    res = tune(model, hw, a.seq, base=base, space=space, workers=a.workers, progress=not a.quiet)
    top = res.top(a.top)
    best_row = top.iloc[0].to_dict() if len(top) else None
    compared = _compare(model, hw, res.best, peer, zero3, a.compare) if a.compare else None
    from horizon_sim.plan.advice import policy_flags
    plan_it = (f"horizon plan --model {a.model} {machine_flags(a, hw)} {policy_flags(res.best)}".rstrip()
               if res.best else None)
    from horizon_sim.job.cli import save_job, saved_line, train_command
    job = save_job(a, model, hw, res.best) if a.save_job and res.best else None
    train_it = train_command(a, hw, res.best) if res.best else None  # the flags that train the best row
    if a.json:
        print(json.dumps({
            "model": model.name, "params": model.total_params, "hardware": hw.name or hw.device.name,
            "ram_bytes": int(round(hw.host.ram_GiB * GiB)), "seq": a.seq, "evaluated": res.evaluated,
            "fits": res.best is not None, "best_policy": res.best.to_dict() if res.best else None,
            "best": jsonable(best_row) if best_row else None, "baseline": jsonable(res.baseline),
            "top": [jsonable(r) for r in top.to_dict("records")],
            "pareto": [jsonable(r) for r in res.pareto.to_dict("records")], "plan_command": plan_it,
            "train_command": train_it, **({"job": a.save_job} if job else {}),
            **({"compare": compared[1]} if compared else {})}))
        return 0
    print(f"tune: {model.name} ({params_label(model)}) on {hw.name or hw.device.name}, "
          f"seq {a.seq}: {res.evaluated} configurations simulated")
    b = res.baseline
    base_txt = (f"{b['tokens_per_s']:,.0f} tokens/s" if b["fits"]
                else f"does not fit ({b['why_not']})")
    if best_row is None:
        closest = res.table.loc[res.table.shortfall.idxmin()]
        print(f"base policy: {base_txt}")
        if "device" in closest.why_not:  # what frees device memory: a smaller step, or a bigger device
            hint = "a smaller --batch or --seq, or a GPU with more memory"
        elif getattr(a, "lora_rank", 0):  # (a frozen base has no host optimizer state to shrink)
            hint = "more --ram (horizon min-ram), --base-quant nf4, or a smaller --seq"
        else:
            hint = "--states-dtype bf16, --grad-clip 0, more --ram (horizon min-ram) or a smaller --seq"
        raise HorizonError(
            f"nothing in the search space fits {hw.device.name} with {fmt_bytes(hw.host.ram_GiB * GiB)} RAM; "
            f"closest: batch {closest.batch}, K={closest.act_ckpt_every}, {closest.optimizer}, "
            f"{closest.why_not}; try {hint}")
    gain = f" ({best_row['tokens_per_s'] / b['tokens_per_s']:.2f}x)" if b["fits"] else ""
    print(f"base policy {base_txt}  ->  best {best_row['tokens_per_s']:,.0f} tokens/s{gain}, fits with "
          f"{fmt_bytes(hw.device_bytes_usable - best_row['device_peak_bytes'])} of device memory and "
          f"{fmt_bytes(hw.host_bytes_usable - best_row['host_bytes'])} of host RAM to spare")
    print()
    cols = COLS if not getattr(a, "lora_rank", 0) else COLS[:COLS.index(ADAPTERS_AFTER) + 1] + [ADAPTERS_COL] + \
        COLS[COLS.index(ADAPTERS_AFTER) + 1:]  # (with adapters: where they live)
    print(f"top {len(top)} configurations that fit:")
    print(format_table(top.to_dict("records"), cols))
    if fixed_batch is None and res.best.batch >= a.max_batch:
        print(f"(the best uses --max-batch {a.max_batch} sequences per step; a larger cap would be faster still)")
    print()
    print("Pareto front, tokens/s against host RAM (fits the device; 'RAM' is what to install):")
    pcols = [("RAM", "ram_needed_bytes", lambda n: f"{n // GiB} GiB"),
             ("fits here", "fits", lambda f: "yes" if f else "no")] + cols
    print(format_table(res.pareto.to_dict("records"), pcols))
    print()
    print(f"plan it:  {plan_it}")
    print(saved_line(a.save_job, job) if job else f"train it: {train_it}")
    if compared:
        print()
        print(compared[0])
    return 0


def _compare(model, hw, best, peer, zero3, name: str = "zero3-offload") -> tuple[str, dict]:
    """(text, JSON) of the peer at its best batch against Horizon's best policy."""
    if peer is None:
        from horizon_sim.plan.families import peer as peer_family
        return (f"compare   {peer_family(name).title}: no batch up to --max-batch fits this machine, with or without "
                "activation checkpointing", {"peer": name, "fits": False})
    from horizon_sim.peer.compare import compare_json, compare_text
    from horizon_sim.plan import plan
    if best is None:
        return (f"compare   {zero3.title} fits at batch {zero3.batch} ({peer.summary.tokens_per_s:,.0f} "
                "tokens/s); nothing in Horizon's search space does", {"peer": name, "fits": True,
                                                                       "peer_policy": zero3.to_dict()})
    ours = plan(model, hw, best)
    head = f"each at its fastest batch that fits: Horizon {best.batch}, {zero3.title.removeprefix('DeepSpeed ')} {zero3.batch}\n"
    return head + compare_text(ours, peer, zero3), compare_json(ours, peer, zero3)
