"""`horizon plan`: does it fit, how fast, what limits it."""
import argparse
import json

from horizon_sim.errors import HorizonError

from horizon_sim.cli.hardware_args import add_cluster_args, with_cluster
from horizon_sim.cli.policy_args import add_policy_args, fit_seq_to_positions, policy_from_args
from horizon_sim.job.cli import add_save_job_arg, check_job_path, save_job, saved_line
from horizon_sim.job.build import plan_policy
from horizon_sim.plan.core_split import threads_setting
from horizon_sim.plan.plan import scaling_efficiency
from horizon_sim.plan.advice import advise
from horizon_sim.peer.compare import compare_json, compare_text, parse_knobs
from horizon_sim.plan.families import peer
from horizon_sim.schedule.op import PEERS
from horizon_sim.sim.simulate import SimResult
from horizon_sim.specs.hardware_presets import DEVICES, LINKS, make_hardware
from horizon_sim.specs.hardware_io import load_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.units import fmt_bytes
from horizon_sim.specs.moe import params_label

EXAMPLE = """example:
  horizon plan --model llama-3.1-8b --gpu h100-pcie --ram 512GiB
  horizon plan --model dense-120b --gpu h200 --ram 1.5TB --optimizer backward --json
  horizon plan --model ./my-model/config.json --hardware machine.toml --batch 8 --seq 4096
  horizon plan --model llama-3.1-405b --gpu h200 --ram 1.5TB --gpus 8 --nodes 8   # data parallel
  horizon plan --model llama-3.1-8b --gpu a100-80gb --ram 256GiB --compare zero3-offload
  horizon plan --model qwen2.5-32b --gpu h200 --compare zero3-offload --peer-knobs act_ckpt=off"""


def configure(p: argparse.ArgumentParser) -> None:
    p.description = ("Predict one RAM-centric training step: whether it fits in device memory "
                     "and host RAM, step time, tokens/s, MFU, the bottleneck and the timeline behind it.")
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--model", default="llama-3.1-8b",
                   help="a preset name (e.g. llama-3.1-8b, qwen2.5-72b, dense-120b) or a path to an "
                        "HF config.json (default llama-3.1-8b)")
    p.add_argument("--gpu", default="h100-sxm", help=f"device preset: {', '.join(DEVICES)} (default h100-sxm)")
    p.add_argument("--ram", default="512GiB", help="host RAM: 1TB, 1.5TB, 1024GiB, 512G (default 512GiB)")
    p.add_argument("--link", default=None, help=f"link preset: {', '.join(LINKS)} (default: the GPU's)")
    p.add_argument("--hardware", default=None, metavar="FILE.toml",
                   help="a hardware file (from `horizon calibrate` or hand-written); overrides --gpu/--link/--ram")
    add_cluster_args(p)
    add_policy_args(p)
    p.add_argument("--compare", default=None, choices=PEERS,
                   help="also plan the same model, batch and machine under DeepSpeed ZeRO-3 with parameters and "
                        "optimizer offloaded to CPU (zero3-offload) or ZeRO-2 with the optimizer offloaded and the "
                        "parameters on the GPU (zero2-offload), one device, and show both side by side with where "
                        "the difference comes from")
    p.add_argument("--peer-knobs", default=None, metavar="K=V,...",
                   help=f"the peer's DeepSpeed knobs, defaults DeepSpeed's (batch and dtype Horizon's): {knobs_help()}")
    p.add_argument("--compute-threads", default=None, type=_threads, metavar="auto|N",
                   help="on a CPU-backend hardware file (`horizon calibrate`'s): the compute lane's threads, the "
                        "rest of the cores for the lanes; auto (default) prices each count the file measured and "
                        "takes the fastest, as `horizon train` does")
    p.add_argument("--sources", action="store_true",
                   help="print each number of the --gpu/--link/host presets with where it comes from (datasheet, "
                        "measured, published or estimate) instead of planning")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--no-advice", action="store_true",
                   help="skip the what-to-change search (a few extra simulations)")
    add_save_job_arg(p)


def _threads(text: str):
    try:
        return threads_setting(text)
    except HorizonError as e:  # argparse then prints the message itself, exit 2
        raise argparse.ArgumentTypeError(str(e).removeprefix("--compute-threads ")) from None


def knobs_help() -> str:
    """Each of the peer's knobs with its default, from its policy type (so the list stays true)."""
    from dataclasses import MISSING, fields

    from horizon_sim.peer.zero3_policy import Zero3Policy
    skip = {"batch", "seq", "micro_batches", "compute_dtype", "grad_clip"}  # Horizon's flags set these
    def show(v):
        if isinstance(v, bool):
            return "on" if v else "off"
        return f"{v:.0e}".replace("e+0", "e") if isinstance(v, int) and v >= 10**5 else f"{v:g}"
    return ", ".join(f"{f.name} ({show(f.default)})" for f in fields(Zero3Policy)
                     if f.name not in skip and f.default is not MISSING)


def result_json(r: SimResult) -> dict:
    s = r.summary
    meta = r.schedule.meta
    return {
        "model": meta.model.name, "hardware": r.hardware.name or r.hardware.device.name,
        "params": _params(r), "fits": s.fits, "why": s.why,
        "step_time_s": s.step_time_s, "tokens_per_s": s.tokens_per_s, "model_TFLOPs": s.model_TFLOPs,
        "mfu": s.mfu, "hfu": s.hfu, "bottleneck": s.bottleneck, "roofline_s": s.roofline_s,
        "lane_busy": s.lane_busy, "exposed_copy_s": s.exposed_copy_s,
        "exposed_optimizer_s": s.exposed_optimizer_s, "exposed_host_s": s.exposed_host_s,
        "device_peak_bytes": s.device_peak_bytes, "device_typical_peak_bytes": s.device_typical_peak_bytes,
        "device_usable_bytes": s.device_usable_bytes,
        "host_bytes": s.host_bytes, "host_usable_bytes": s.host_usable_bytes,
        "host_breakdown_bytes": r.host.by_role, "policy": r.policy.to_dict(),
        "devices_per_node": meta.layout.devices_per_node, "nodes": meta.layout.nodes, "ranks": s.ranks,
        "exposed_network_s": s.exposed_network_s,
        "disk_bytes": s.memory.disk_need_bytes, "exposed_disk_s": s.exposed_disk_s,
        "simulated_micro_batches": list(r.extension.simulated) if r.extension else None,
    }


def _params(r: SimResult) -> int:
    return r.schedule.meta.model.total_params


def report(r: SimResult, efficiency: float | None = None) -> str:
    s, meta, hw = r.summary, r.schedule.meta, r.hardware
    pol, n, cl = r.policy, _params(r), hw.cluster
    verdict = "FITS" if s.fits else "DOES NOT FIT"
    if s.ranks == 1:
        where = f"{hw.device.name} + {hw.link.name} with {fmt_bytes(hw.host.ram_GiB * 2**30)} host RAM"
    else:
        where = (f"{cl.layout.nodes} node(s) x {cl.layout.devices_per_node} {hw.device.name} ({s.ranks} ranks) "
                 f"+ {hw.link.name}, "
                 f"{fmt_bytes(hw.host.ram_GiB * 2**30)} host RAM per node")
    lines = [
        f"{verdict}: {meta.model.name} ({params_label(meta.model)}) on {where}",
        f"  {s.why}",
        "",
        f"speed     {s.tokens_per_s:,.0f} tokens/s, step {s.step_time_s:.3f} s "
        f"(lower bound {s.roofline_s:.3f} s), MFU {s.mfu:.1%}, HFU {s.hfu:.1%}, "
        f"{s.model_TFLOPs:.1f} model TFLOP/s",
        f"limit     {s.bottleneck}; compute idle waiting on: copies {s.exposed_copy_s:.3f} s, "
        f"optimizer {s.exposed_optimizer_s:.3f} s, host work {s.exposed_host_s:.3f} s"
        + (f", collectives {s.exposed_network_s:.3f} s" if s.ranks > 1 else "")
        + (f", disk {s.exposed_disk_s:.3f} s" if s.memory.disk_need_bytes else ""),
        "lanes     " + ", ".join(f"{k} {v:.0%} busy" for k, v in s.lane_busy.items()),
        f"device    peak {fmt_bytes(s.device_peak_bytes)} at most whatever the timing ({_timeline_peak(r)}) "
        f"of {fmt_bytes(s.device_usable_bytes)} usable "
        f"({pol.slots} weight slots of {fmt_bytes(meta.slot_bytes)})",
        f"host      {fmt_bytes(s.host_bytes)} of {fmt_bytes(s.host_usable_bytes)} usable"
        + (" per node (its ranks' buffers, the host store once):" if s.ranks > 1 else ":"),
    ]
    if s.ranks > 1:
        eff = f", scaling efficiency {efficiency:.0%} against one device" if efficiency is not None else ""
        lines.insert(3, f"cluster   {cl.name}: fabric {cl.fabric_GBps:g} GB/s per device, network "
                        f"{cl.net_GBps:g} GB/s per node; every rank runs batch {pol.batch}{eff}")
    for role, b in r.host.by_role.items():
        if b:
            lines.append(f"            {role:<16}{fmt_bytes(b):>12}  {b / n:6.2f} B/param")
    disk = s.memory.disk_need_bytes
    if disk:
        what = "the Adam moments" + (" and the master's low halves" if pol.disk_tier == "moments+low" else "")
        lines.append(f"disk      {fmt_bytes(disk)} of {fmt_bytes(hw.disk_bytes_usable)} ({disk / n:.2f} B/param: {what}), "
                     f"read and written once a step at {hw.host.disk_read_GBps:g}/{hw.host.disk_write_GBps:g} GB/s")
    lines += [
        "",
        f"policy    batch {pol.batch} x seq {pol.seq} ({pol.tokens:,} tokens/step, "
        f"{pol.micro_batches} micro-batch(es){', layer order' if pol.mb_order == 'layer' else ''}), "
        f"K={pol.act_ckpt_every}, {_kept_text(pol, meta.n_layers)}, slots {pol.slots}, "
        f"checkpoints on {pol.act_ckpt_on}, "
        + ("adapters updated on the device after the backward" if pol.adapters else f"optimizer {pol.optimizer}")
        + f", clip {pol.grad_clip:g}",
        _adapter_text(pol, meta.model) if pol.adapters else
        f"          compute {pol.compute_dtype}, master "
        f"{'fp32 split (bf16 working copy + 16-bit low half)' if pol.split_master else pol.master_dtype}, "
        f"moments {pol.states_dtype}, grads {pol.grad_dtype} over the link, working copy "
        f"{'on' if pol.working_copy else 'off'}"
        + (f"\n          {pol.objective_text}" if pol.objective_text else ""),
    ]
    if r.extension:
        counts = r.extension.simulated
        lines.append(f"simulated {', '.join(map(str, counts[:-1]))} and {counts[-1]} of the {pol.micro_batches} "
                     f"micro-batches, the figures extended along the line through them "
                     f"(+{r.extension.per_micro_batch_s:.3f} s a micro-batch); the timeline is of {counts[-1]}")
    return "\n".join(lines)


def _timeline_peak(r: SimResult) -> str:
    if r.extension and not r.extension.timeline_peak:
        return "this timeline's own peak not extended past the counts simulated"
    return f"this timeline {fmt_bytes(r.summary.device_typical_peak_bytes)}"


def _kept_text(pol, n_layers: int) -> str:
    """How many layers keep their activations (Policy.keep_last) and the rest recompute."""
    kept = pol.kept_layers(n_layers)
    return ("no layer keeps activations" if not kept else
            f"{kept} of {n_layers} layers keep activations (no recompute)")


def sources(hw) -> dict:
    """Each priced number of the machine's presets and its source (specs/preset_sources.py):
    {kind: {"name": preset, "numbers": {field: {"value": v, "source": text or None}}}}, kinds
    device, link, host; a table's value is its rows (lists). What --sources prints, as text or JSON."""
    from horizon_sim.specs.preset_sources import PRICED, source_of
    out = {}
    for kind in ("device", "link", "host"):
        part = getattr(hw, kind)
        out[kind] = {"name": part.name, "numbers": {
            f: {"value": [list(row) for row in v] if isinstance(v, tuple) else v,
                "source": source_of(kind, part, f)}
            for f in PRICED[kind] for v in (getattr(part, f),)}}
    return out


def sources_text(hw) -> str:
    """sources(hw) as lines: each preset, then each number, its value (a table: its row count) and source."""
    lines = []
    for kind, part in sources(hw).items():
        lines.append(f"{kind} {part['name']}")
        for f, n in part["numbers"].items():
            v = n["value"]
            shown = f"{len(v)} rows" if isinstance(v, list) else f"{v:g}"
            lines.append(f"  {f} = {shown}: {n['source'] or 'no source'}")
    return "\n".join(lines)


def machine_from_args(a: argparse.Namespace):
    """The machine `horizon plan`'s flags describe: a hardware file or presets, with the layout."""
    return with_cluster(load_hardware(a.hardware) if a.hardware else make_hardware(a.gpu, a.ram, a.link), a)


def _adapter_text(pol, model) -> str:
    """The policy's second line under adapters: what is trained, and where each part lives."""
    from horizon_sim.schedule.work import adapter_params, adapted, layer_policy, target_name
    per = [(model.block_spec(u), layer_policy(model, pol, u)) for u in range(model.n_layers)]
    n = sum(adapter_params(s, lp) for s, lp in per)
    names = ",".join(dict.fromkeys(target_name(p) for s, lp in per for p in adapted(s, lp)))
    return (f"          compute {pol.compute_dtype}, LoRA rank {pol.lora_rank} on {names}: {n:,} adapter parameters "
            f"({n / model.total_params:.2%} of the model) with their AdamW state "
            + ("on the device" if pol.adapters_on == "device" else "in host RAM, each block's streamed with its weights")
            + f" ({fmt_bytes(16 * n)}), the base frozen on the host in {pol.base_form}"
            + (f"\n          {pol.objective_text}" if pol.objective_text else ""))


def peer_policy_from_args(a: argparse.Namespace, policy, name: str | None = None):
    """The peer's policy (--compare, or `name`) on the same batch, with the --peer-knobs given."""
    fam = peer(name or a.compare)
    return fam.like(policy, **parse_knobs(a.peer_knobs, fam.policy_type))


def run(a: argparse.Namespace) -> int:
    if getattr(a, "sources", False):
        if a.hardware:
            from horizon_sim.errors import HorizonError
            raise HorizonError("--sources lists the presets' sources; a --hardware file's numbers are its own "
                               "(calibrate measured them, or whoever wrote it)")
        hw = make_hardware(a.gpu, a.ram, a.link)
        print(json.dumps(sources(hw)) if a.json else sources_text(hw))
        return 0
    hw = machine_from_args(a)
    if a.save_job:
        check_job_path(a.save_job)  # before any planning
    if getattr(a, "peer_knobs", None) and not getattr(a, "compare", None):
        from horizon_sim.errors import HorizonError
        raise HorizonError("--peer-knobs sets the compared peer's knobs: add --compare zero3-offload (or zero2-offload)")
    model = load_model(a.model)
    fit_seq_to_positions(a, model)
    policy = policy_from_args(a, hw)
    other = zero3 = None
    if getattr(a, "compare", None):
        zero3 = peer_policy_from_args(a, policy)
        other = peer(a.compare).plan(model, hw, zero3)  # before our own plan: a bad peer setting fails fast
    machine = hw  # as given: the job's [hardware] (the priced one is at a core split)
    r, split = plan_policy(model, hw, policy, a.compute_threads)
    job = save_job(a, model, machine, policy, result=r, split=split) if a.save_job else None
    tips = advise(r, search=not getattr(a, "no_advice", False))
    eff = scaling_efficiency(r)
    if a.json:
        out = {**result_json(r), "scaling_efficiency": eff, "advice": tips}
        if other is not None:
            out["compare"] = compare_json(r, other, zero3)
        if split is not None:
            out["core_split"] = {"compute_threads": split.compute_threads, "cores": split.cores,
                                 "measured": split.measured,
                                 "step_s_by_threads": {str(p.compute_threads): p.step_s for p in split.prices}}
        if job is not None:
            out["job"] = a.save_job
        print(json.dumps(out))
        return 0
    print(report(r, eff))
    if split is not None:
        print(f"cores     {split.line()}")
    if tips:
        print()
        for i, t in enumerate(tips):
            print(("advice    " if i == 0 else "          ") + t)
    if other is not None:
        print()
        print(compare_text(r, other, zero3))
    if job is not None:
        print()
        print(saved_line(a.save_job, job))
    return 0
