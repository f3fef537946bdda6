"""Horizon's plan and a DeepSpeed peer's (ZeRO-3 offload, or ZeRO-2 offload), side by side on the same model, batch and
machine: fits, device peak, host RAM, tokens/s, bottleneck, speedup, and where the difference
comes from (link bytes, exposed optimizer time, device memory), for `horizon plan --compare`.

    ours, peer = plan(model, hw, policy), plan_zero3(model, hw, zero3_like(policy))
    print(compare_text(ours, peer))
"""
from dataclasses import fields, replace

from horizon_sim.errors import HorizonError
from horizon_sim.peer.zero3_builder import build_zero3_schedule
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule.op import Family, Lane, OpKind
from horizon_sim.sim.simulate import SimResult, simulate, simulate_micro_batches
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import fmt_bytes


def zero3_like(policy: Policy, **knobs) -> Zero3Policy:
    """The peer run on the same batch: the same sequences, micro-batches, compute dtype and
    clipping; DeepSpeed's defaults for the rest (activation checkpointing on, as users run a
    large model under ZeRO-3 offload), overridden by `knobs` (Zero3Policy fields)."""
    if knobs.get("offload_param", True) is not True:
        raise HorizonError("offload_param=off (parameters on the GPU) is DeepSpeed ZeRO-2 offload: compare with "
                           "zero2-offload instead of zero3-offload")
    return _like(policy, knobs)


def zero2_like(policy: Policy, **knobs) -> Zero3Policy:
    """ZeRO-2 offload on the same batch (zero3_like, with the parameters on the GPU)."""
    if knobs.get("offload_param", False) is not False:
        raise HorizonError("offload_param=on (parameters offloaded) is DeepSpeed ZeRO-3 offload: compare with "
                           "zero3-offload instead of zero2-offload")
    return _like(policy, {**knobs, "offload_param": False})


def _like(policy: Policy, knobs: dict) -> Zero3Policy:
    if policy.adapters:  # a like-for-like peer would be DeepSpeed with peft, which no peer family prices
        raise HorizonError(f"the DeepSpeed peers are planned for full fine-tuning; with --lora-rank {policy.lora_rank} "
                           "there is no peer step to compare with: drop --compare (or --lora-rank)")
    base = dict(batch=policy.batch, seq=policy.seq, micro_batches=policy.micro_batches,
                compute_dtype=policy.compute_dtype, grad_clip=policy.grad_clip)
    return Zero3Policy(**{**base, **knobs})


def parse_knobs(text: str | None, policy_type: type = Zero3Policy) -> dict:
    """'act_ckpt=off,reduce_bucket_params=2e8' -> {'act_ckpt': False, 'reduce_bucket_params': 200000000}:
    fields of `policy_type` (a family's policy: plan/families.py), typed as it declares them."""
    if not text:
        return {}
    types = {f.name: f.type for f in fields(policy_type)}
    out = {}
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in types:
            raise HorizonError(f"--peer-knobs {item.strip()!r}: use KEY=VALUE with KEY one of {', '.join(types)}")
        value = value.strip()
        kind = types[key] if isinstance(types[key], str) else types[key].__name__
        try:
            if kind == "bool":
                if value.lower() not in ("on", "off", "true", "false", "1", "0"):
                    raise ValueError
                out[key] = value.lower() in ("on", "true", "1")
            elif kind == "int":
                f = float(value)
                if f != int(f):
                    raise ValueError
                out[key] = int(f)
            elif kind == "float":
                out[key] = float(value)
            else:
                out[key] = value
        except ValueError:
            raise HorizonError(f"--peer-knobs {key}={value!r}: not a valid {kind}") from None
    return out


def peer_hardware(hw: HardwareSpec, zero3: Zero3Policy) -> HardwareSpec:
    """The machine as the peer uses it: its optimizer at DeepSpeedCPUAdam's rate on this host
    (HostSpec.deepspeed_adam_Gparams_per_s). Which copies are pageable (pin_memory off) the
    Schedule says, op by op (Op.pageable): the gradient buffers', never the parameter fetches'
    (Zero3Policy.pin_memory)."""
    return replace(hw, host=replace(hw.host, adam_Gparams_per_s=hw.deepspeed_adam_Gparams_per_s))


def plan_zero3(model: ModelSpec, hw: HardwareSpec, zero3: Zero3Policy) -> SimResult:
    """Simulate one step of DeepSpeed ZeRO-3 offload of `model` on `hw` (one device); with
    offload_param off, of ZeRO-2 offload."""
    if hw.cluster.ranks > 1:
        raise HorizonError(f"the {zero3.title} peer is modelled on one device: drop --gpus/--nodes to compare")
    def build(k: int):
        return build_zero3_schedule(model, replace(zero3, batch=zero3.micro_batch * k, micro_batches=k))
    # many micro-batches: a few simulated and extended, as Horizon's (sim/extend.py)
    return simulate_micro_batches(build, zero3.horizon_policy(), model.n_layers, peer_hardware(hw, zero3))


def tune_zero3(model: ModelSpec, hw: HardwareSpec, seq: int, *, max_batch: int = 64, grad_clip: float = 1.0,
               knobs: dict | None = None) -> tuple[SimResult | None, Zero3Policy | None]:
    """The peer at its fastest batch (powers of two up to max_batch) with activation
    checkpointing on or off (unless `knobs` fixes it): the result that fits with the most
    tokens/s, else (None, None). DeepSpeed's other knobs stay at `knobs` or its defaults
    (offload_param=False among them: ZeRO-2 offload)."""
    knobs = dict(knobs or {})
    ckpts = [knobs.pop("act_ckpt")] if "act_ckpt" in knobs else [True, False]
    best = (None, None)
    batch = 1
    while batch <= max_batch:
        for ck in ckpts:
            zero3 = Zero3Policy(**{"batch": batch, "seq": seq, "grad_clip": grad_clip, "act_ckpt": ck, **knobs})
            r = plan_zero3(model, hw, zero3)
            if r.summary.fits and (best[0] is None or r.summary.tokens_per_s > best[0].summary.tokens_per_s):
                best = (r, zero3)
        batch *= 2
    return best


def _link_bytes(r: SimResult) -> dict:
    out = {"h2d": 0, "d2h": 0}
    for op in r.schedule.ops:
        if op.lane in (Lane.H2D, Lane.D2H):
            out[op.lane.value] += op.link_bytes
    return out


def _optimizer_s(r: SimResult) -> float:
    tl = r.timeline
    return float(tl[tl.kind == OpKind.OPTIMIZER.value].dur_s.sum())


def compare_rows(ours: SimResult, peer: SimResult) -> list[tuple[str, str, str]]:
    """(figure, Horizon, the peer) rows."""
    a, b = ours.summary, peer.summary
    n = ours.schedule.meta.model.total_params
    la, lb = _link_bytes(ours), _link_bytes(peer)
    rows = [
        ("fits", "yes" if a.fits else "NO", "yes" if b.fits else "NO"),
        ("tokens/s", f"{a.tokens_per_s:,.0f}", f"{b.tokens_per_s:,.0f}"),
        ("step", f"{a.step_time_s:.3f} s", f"{b.step_time_s:.3f} s"),
        ("bottleneck", a.bottleneck, b.bottleneck),
        ("MFU", f"{a.mfu:.1%}", f"{b.mfu:.1%}"),
        ("device peak", fmt_bytes(a.device_peak_bytes), fmt_bytes(b.device_peak_bytes)),
        ("host RAM", fmt_bytes(a.host_bytes), fmt_bytes(b.host_bytes)),
        ("host B/param", f"{a.host_bytes / n:.2f}", f"{b.host_bytes / n:.2f}"),
        ("link h2d / step", fmt_bytes(la["h2d"]), fmt_bytes(lb["h2d"])),
        ("link d2h / step", fmt_bytes(la["d2h"]), fmt_bytes(lb["d2h"])),
        ("optimizer (CPU)", f"{_optimizer_s(ours):.3f} s", f"{_optimizer_s(peer):.3f} s"),
        ("compute waits on optimizer", f"{a.exposed_optimizer_s:.3f} s", f"{b.exposed_optimizer_s:.3f} s"),
        ("compute waits on copies", f"{a.exposed_copy_s:.3f} s", f"{b.exposed_copy_s:.3f} s"),
    ]
    return rows


def why_text(ours: SimResult, peer: SimResult) -> list[str]:
    """Where the difference comes from, in sentences built from the two timelines."""
    a, b = ours.summary, peer.summary
    lines = []
    speed = a.tokens_per_s / b.tokens_per_s if b.tokens_per_s else float("inf")
    lines.append(f"Horizon is {speed:.2f}x the peer's tokens/s on this machine"
                 + ("" if a.fits and b.fits else " (as simulated; see what does not fit below)") + ".")
    b_wait = b.exposed_optimizer_s - a.exposed_optimizer_s
    if b_wait > 0.01 * b.step_time_s:
        lines.append(f"The peer's CPU Adam runs after the backward with the device idle: {b.exposed_optimizer_s:.2f} s "
                     f"of its step; Horizon overlaps its optimizer with the next step's streaming "
                     f"({a.exposed_optimizer_s:.2f} s exposed).")
    la, lb = _link_bytes(ours), _link_bytes(peer)
    zero2 = peer.schedule.meta.family == Family.ZERO2_OFFLOAD
    if sum(lb.values()) > 1.05 * sum(la.values()):
        lines.append(f"The peer moves {fmt_bytes(sum(lb.values()))} over the link per step against "
                     f"{fmt_bytes(sum(la.values()))}: its gradients go out in fp32 (4 bytes a parameter) and "
                     + ("the updated parameters come back after its CPU Adam." if zero2 else
                        "released parameters are fetched again for the backward."))
    if b.device_peak_bytes > 1.2 * a.device_peak_bytes:
        held = ("every parameter stays on the device, with its layer checkpoints" if zero2 else
                "its layer checkpoints or saved activations stay on the device")
        lines.append(f"Device memory: the peer peaks at {fmt_bytes(b.device_peak_bytes)} ({held}, and the LM "
                     f"head's logits for every token at once) against Horizon's {fmt_bytes(a.device_peak_bytes)}.")
    for who, s in (("Horizon", a), ("The peer", b)):
        if not s.fits:
            lines.append(f"{who} does not fit: {s.why}")
    if speed < 1:
        lines.append("Here the peer is faster: Horizon's streaming costs more than it hides on this configuration.")
    return lines


def compare_text(ours: SimResult, peer: SimResult, zero3: Zero3Policy) -> str:
    rows = compare_rows(ours, peer)
    w = max(len(r[0]) for r in rows) + 2
    c = max(len(r[1]) for r in rows) + 2
    fetch = (f"prefetch {zero3.prefetch_bucket_params:,.0f}" if zero3.offload_param else
             "parameters on the device" + (", tiled parameter copy" if zero3.adam_copies_params else ""))
    knobs = (f"activation checkpointing {'on' if zero3.act_ckpt else 'off'}, {fetch}, "
             f"reduce bucket {zero3.reduce_bucket_params:,.0f} params, overlap_comm {'on' if zero3.overlap_comm else 'off'}, "
             f"{'pinned' if zero3.pin_memory else 'pageable gradient'} buffers")
    short = zero3.title.removeprefix("DeepSpeed ")
    out = [f"compare   Horizon against {zero3.title} ({knobs})", "",
           f"          {'':<{w}}{'Horizon':<{c}}{short}"]
    out += [f"          {r[0]:<{w}}{r[1]:<{c}}{r[2]}" for r in rows]
    out += [""] + [f"why       {t}" if i == 0 else f"          {t}" for i, t in enumerate(why_text(ours, peer))]
    return "\n".join(out)


def compare_json(ours: SimResult, peer: SimResult, zero3: Zero3Policy) -> dict:
    a, b = ours.summary, peer.summary
    return {"peer": zero3.family.value, "peer_policy": zero3.to_dict(), "fits": b.fits, "why": b.why,
            "tokens_per_s": b.tokens_per_s, "step_time_s": b.step_time_s, "bottleneck": b.bottleneck,
            "device_peak_bytes": b.device_peak_bytes, "host_bytes": b.host_bytes,
            "host_breakdown_bytes": peer.host.by_role, "link_bytes": _link_bytes(peer),
            "exposed_optimizer_s": b.exposed_optimizer_s,
            "speedup": a.tokens_per_s / b.tokens_per_s if b.tokens_per_s else None,
            "why_text": why_text(ours, peer)}
