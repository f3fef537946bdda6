"""advise(): what to change when a plan does not fit, and what would move its bottleneck.

Not fitting: which memory is short and by how much, then the nearest policy that fits, found
by breadth-first search over a few memory-saving changes (a split master, optimizer in backward
with clipping off, host gradients bounded, no working copy, checkpoints on the host or the device, bf16 moments, a larger K, smaller
micro-batches, a smaller batch). Changes that leave the trained model as it was (where things
live, recompute, accumulation) are tried before those that change the training itself (LOSSY:
no clipping, bf16 moments, a smaller batch): combinations are visited by (lossy changes, all
changes), and the fastest that fits at the first such level wins. Fitting: re-simulate a few what-ifs (the next faster link,
the other checkpoint placement, a bigger batch, the optimizer mode, a faster host optimizer) and
report those that move the step by a few percent or more.
"""
from dataclasses import dataclass, replace
from itertools import combinations

from horizon_sim.errors import HorizonError
from horizon_sim.plan.outcome import Outcome, outcome_of, round_up_ram
from horizon_sim.plan.runner import Runner
from horizon_sim.sim.simulate import SimResult
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.hardware_presets import LINKS
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import HOST_UPDATE_FIELDS, KEEP_ALL, Policy
from horizon_sim.units import GiB, fmt_bytes

MIN_GAIN = 0.03
"""What-ifs that change the step time by less than this fraction are not reported."""


# ---- moves: (name, applies to 'host'/'device' shortage, Policy -> Policy or None) ------------
def _backward(p, m):
    return replace(p, optimizer="backward", grad_clip=0.0) if p.optimizer != "backward" else None


def _no_wc(p, m):
    return replace(p, working_copy=False, split_master=False) if p.working_copy else None


def _split_master(p, m):
    ok = p.working_copy and (p.master_dtype, p.compute_dtype) == ("fp32", "bf16") and not p.split_master
    return replace(p, split_master=True) if ok else None


def _bound_host_grads(p, m):
    ok = p.optimizer == "backward" and p.micro_batches == 1 and not p.max_host_grads
    return replace(p, max_host_grads=BOUNDED_HOST_GRADS) if ok else None


def _ckpt_host(p, m):
    return replace(p, act_ckpt_on="host") if p.act_ckpt_on != "host" else None


def _ckpt_device(p, m):
    return replace(p, act_ckpt_on="device") if p.act_ckpt_on != "device" else None


def _bf16_states(p, m):
    return replace(p, states_dtype="bf16") if p.states_dtype != "bf16" else None


def _double_k(p, m):
    return replace(p, act_ckpt_every=p.act_ckpt_every * 2) if p.act_ckpt_every * 2 <= m.n_layers else None


def _split_micro(p, m):
    return replace(p, micro_batches=p.micro_batches * 2) if p.micro_batch % 2 == 0 else None


def _one_micro(p, m):
    return replace(p, micro_batches=1) if p.micro_batches > 1 else None


def _half_batch(p, m):
    return replace(p, batch=p.batch // 2) if p.micro_batch % 2 == 0 else None


def _keep_fewer(p, m):
    """Half as many kept layers (none from one): their saved tensors are device memory."""
    kept = p.kept_layers(m.n_layers)
    return replace(p, keep_last=kept // 2) if kept else None


def _two_slots(p, m):
    return replace(p, slots=2) if p.slots > 2 else None


LOSSY = frozenset({"optimizer backward, clip 0", "bf16 moments", "batch halved"})
"""Moves that change what training computes (clipping, moment precision, the batch), not only
where things live or when: a user gives these up last."""

BOUNDED_HOST_GRADS = 2
"""The bound the 'host grads bounded' move sets: two units' gradients wait for the optimizer
(one being applied, one landing), the least that keeps both the link and the optimizer busy."""

MOVES = (  # (name, helps host, helps device, fn)
    ("split master", True, False, _split_master),
    ("optimizer backward, clip 0", True, False, _backward),
    ("host grads bounded", True, False, _bound_host_grads),
    ("no working copy", True, False, _no_wc),
    ("checkpoints on host", False, True, _ckpt_host),
    ("checkpoints on device", True, False, _ckpt_device),
    ("bf16 moments", True, False, _bf16_states),
    ("one micro-batch", True, False, _one_micro),
    ("K doubled", True, True, _double_k),
    ("micro-batches doubled", False, True, _split_micro),
    ("batch halved", False, True, _half_batch),
    ("2 slots", False, True, _two_slots),
    ("kept layers halved", False, True, _keep_fewer),
)

_FLAGS = (  # Policy field -> CLI flag of `horizon plan`
    ("batch", "--batch"), ("seq", "--seq"), ("micro_batches", "--micro-batches"),
    ("act_ckpt_every", "--act-ckpt-every"), ("slots", "--slots"), ("act_ckpt_on", "--act-ckpt-on"),
    ("optimizer", "--optimizer"), ("grad_clip", "--grad-clip"), ("compute_dtype", "--compute-dtype"),
    ("states_dtype", "--states-dtype"), ("grad_dtype", "--grad-dtype"), ("max_host_grads", "--max-host-grads"),
    ("disk_tier", "--disk-tier"), ("master_rounding", "--master-rounding"), ("mb_order", "--mb-order"),
    ("keep_last", "--keep-activations"), ("loss_chunk_tokens", "--loss-chunk-tokens"), ("doc_tokens", "--doc-tokens"),
    ("loss_kernel", "--loss-kernel"), ("lora_rank", "--lora-rank"), ("lora_targets", "--lora-targets"),
    ("lora_alpha", "--lora-alpha"), ("lora_dropout", "--lora-dropout"), ("base_quant", "--base-quant"),
    ("adapters_on", "--adapters-on"),
    ("objective", "--objective"), ("dpo_beta", "--dpo-beta"), ("dpo_loss", "--dpo-loss"),
    ("dpo_label_smoothing", "--dpo-label-smoothing"),
)


def policy_flags(p: Policy, base: Policy | None = None) -> str:
    """The `horizon plan` flags that turn `base` (default: Policy()) into `p`."""
    base = base or Policy()
    out = []
    for f, flag in _FLAGS:
        v = getattr(p, f)
        if p.adapters and f in HOST_UPDATE_FIELDS:
            continue  # a frozen base has none (and --optimizer's default with adapters is after)
        if v != getattr(base, f):
            if f == "keep_last" and v == KEEP_ALL:
                v = "all"
            out.append(f"{flag} {v:g}" if isinstance(v, float) else f"{flag} {v}")
    if p.adapters:
        return " ".join(out + (["--doc-masks"] if p.doc_masks != base.doc_masks and p.doc_masks else []))
    # No --master-dtype: base's own one if it needed one, else the default for p's other flags
    if p.master_choice != (base.master_choice if not base.master_is_default else p.default_master_choice):
        out.append(f"--master-dtype {'split' if p.split_master else p.master_dtype}")
    if p.working_copy != base.working_copy:
        out.append("--no-working-copy" if not p.working_copy else "(working copy on)")
    if p.doc_masks != base.doc_masks:
        out.append("--doc-masks" if p.doc_masks else "(no document masks)")
    return " ".join(out)


@dataclass(frozen=True)
class NearestFit:
    policy: Policy
    outcome: Outcome
    changes: tuple[str, ...]
    """Names of the moves applied, in order."""


def nearest_fit(model: ModelSpec, hw: HardwareSpec, policy: Policy, outcome: Outcome | None = None, *,
                max_changes: int = 3, runner: Runner | None = None, fits=None,
                short: tuple[bool, bool] | None = None, skip: frozenset = frozenset()) -> NearestFit | None:
    """The fastest policy that fits among those with the fewest LOSSY moves, then the fewest
    moves (up to `max_changes`), trying only moves that help the memory that is short.
    An executor checking its own accounting passes `fits` (outcome -> bool; default:
    Outcome.fits(hw)), `short` ((host short, device short); default: from the outcome) and
    `skip` (names of moves it cannot run)."""
    fits = fits or (lambda o: o.fits(hw))
    own = runner is None
    runner = runner or Runner(workers=None)
    try:
        outcome = outcome or runner.one(model, hw, policy)
        if fits(outcome):
            return NearestFit(policy, outcome, ())
        if not outcome.ok:
            return None
        host_short, dev_short = short or (not outcome.fits_host(hw), not outcome.fits_device(hw))
        moves = [mv for mv in MOVES if mv[0] not in skip and ((host_short and mv[1]) or (dev_short and mv[2]))]
        levels: dict[tuple[int, int], list] = {}
        for n in range(1, max_changes + 1):
            for combo in combinations(moves, n):
                lossy = sum(name in LOSSY for name, *_ in combo)
                levels.setdefault((lossy, n), []).append(combo)
        tried: set = {policy}
        for level in sorted(levels):
            cands = {}
            for combo in levels[level]:
                p = policy
                try:
                    for _, _, _, fn in combo:
                        p = fn(p, model) if p is not None else None
                except HorizonError:  # e.g. a batch no longer divisible by micro-batches
                    p = None
                if p is not None and p not in tried and p not in cands:
                    cands[p] = tuple(name for name, *_ in combo)
            tried.update(cands)
            outs = runner.run([(model, hw, p) for p in cands])
            ok = [(o.tokens_per_s, -i, p, o) for i, (p, o) in enumerate(zip(cands, outs)) if o.ok and fits(o)]
            if ok:
                _, _, p, o = max(ok, key=lambda t: t[:2])
                return NearestFit(p, o, cands[p])
        return None
    finally:
        if own:
            runner.close()


def leanest_host_policy(policy: Policy, model: ModelSpec) -> Policy:
    """`policy` with every change that shrinks the host footprint applied."""
    p = policy
    for _, helps_host, _, fn in MOVES:
        if helps_host and fn is not _ckpt_device:
            try:
                p = fn(p, model) or p
            except HorizonError:
                pass
    return p


def _pct(new_s: float, old_s: float) -> str:
    d = (new_s - old_s) / old_s
    if abs(d) < 0.005:
        return "leave the step time as it is"
    return f"cut the step by {-d:.0%}" if d < 0 else f"lengthen the step by {d:.0%}"


def _faster_link(hw: HardwareSpec):
    faster = sorted((l for l in LINKS.values() if l.h2d_GBps > hw.link.h2d_GBps), key=lambda l: l.h2d_GBps)
    return faster[0] if faster else None


def advise(result: SimResult, *, search: bool = True, workers: int | None = None) -> list[str]:
    """Advice for a `horizon plan` result, one sentence per line. `search=False` skips every
    re-simulation (only the shortfall is reported)."""
    meta, hw, s = result.schedule.meta, result.hardware, result.summary
    model, policy = meta.model, result.policy
    out = outcome_of(result)
    lines = []
    if not out.fits_device(hw):
        lines.append(f"device memory is short by {fmt_bytes(s.device_peak_bytes - hw.device_bytes_usable)}: "
                     f"the step peaks at {fmt_bytes(s.device_peak_bytes)}, {hw.device.name} has "
                     f"{fmt_bytes(hw.device_bytes_usable)} usable")
    if not out.fits_host(hw):
        need = round_up_ram(out.ram_needed_bytes(hw))
        lines.append(f"host RAM is short by {fmt_bytes(s.host_bytes - hw.host_bytes_usable)}: the footprint is "
                     f"{fmt_bytes(s.host_bytes)}, {fmt_bytes(hw.host_bytes_usable)} usable; this policy needs "
                     f"{need // GiB} GiB of RAM installed (horizon min-ram)")
    if not search:
        return lines
    with Runner(workers) as runner:
        if not s.fits:
            nf = nearest_fit(model, hw, policy, out, runner=runner)
            if nf is None:
                lines.append("no policy within 3 changes (optimizer in backward, no working copy, "
                             "checkpoint placement, bf16 moments, K, micro-batches, batch) fits")
                if not out.fits_host(hw):
                    lean = leanest_host_policy(policy, model)
                    lo = runner.one(model, hw, lean)
                    if lo.ok:
                        lines.append(f"the leanest host policy ({policy_flags(lean, policy)}) needs "
                                     f"{round_up_ram(lo.ram_needed_bytes(hw)) // GiB} GiB of RAM installed")
            else:
                lines.append(f"nearest policy that fits ({', '.join(nf.changes)}): "
                             f"{policy_flags(nf.policy, policy)} -> {nf.outcome.tokens_per_s:,.0f} tokens/s, "
                             f"device {fmt_bytes(nf.outcome.device_peak_bytes)}, host "
                             f"{fmt_bytes(nf.outcome.host_bytes)}")
            return lines
        lines += _what_ifs(model, hw, policy, out, runner)
    return lines


def _what_ifs(model, hw, policy, out: Outcome, runner: Runner) -> list[str]:
    """Re-simulate what would move the bottleneck; report what changes the step noticeably."""
    tasks = {}
    link = _faster_link(hw)
    if link is not None:
        tasks["link"] = (model, replace(hw, link=link), policy)
    other = "host" if policy.act_ckpt_on == "device" else "device"
    tasks["ckpt"] = (model, hw, replace(policy, act_ckpt_on=other))
    tasks["batch"] = (model, hw, replace(policy, batch=policy.batch * 2))
    # (in micro-batches every gradient waits for the step's end: no bound on them applies)
    tasks["batch_acc"] = (model, hw, replace(policy, batch=policy.batch * 2, micro_batches=policy.micro_batches * 2,
                                             max_host_grads=0))
    if policy.optimizer == "after" and not policy.adapters:  # adapters update on the device, after
        tasks["pipelined"] = (model, hw, replace(policy, optimizer="pipelined"))
    if policy.micro_batches > 1 and policy.mb_order == "micro":
        tasks["layer"] = (model, hw, replace(policy, mb_order="layer"))
    if not policy.adapters:  # (no host optimizer under adapters)
        tasks["adam"] = (model, replace(hw, host=replace(hw.host, adam_Gparams_per_s=2 * hw.host.adam_Gparams_per_s)),
                         policy)
    res = dict(zip(tasks, runner.run(tasks.values())))
    t0, lines = out.step_time_s, []

    def gain(o):
        return o.ok and (t0 - o.step_time_s) / t0

    if "link" in res and gain(res["link"]) >= MIN_GAIN:
        lines.append(f"{link.name} ({link.h2d_GBps:g} GB/s) instead of {hw.link.name} would "
                     f"{_pct(res['link'].step_time_s, t0)}")
    elif "link" in res and "link" in out.bottleneck:
        lines.append(f"compute waits on the link, yet {link.name} would cut the step by under {MIN_GAIN:.0%} "
                     "(the other lanes are nearly as busy)")
    c = res["ckpt"]
    if c.ok and other == "host":
        freed = out.device_peak_bytes - c.device_peak_bytes
        if freed > 0:
            lines.append(f"checkpoints on the host would free {fmt_bytes(freed)} of device memory "
                         f"and {_pct(c.step_time_s, t0)} (--act-ckpt-on host)")
    elif c.ok and c.fits(hw) and gain(c) >= MIN_GAIN:
        lines.append(f"checkpoints on the device (--act-ckpt-on device) would {_pct(c.step_time_s, t0)}, using "
                     f"{fmt_bytes(c.device_peak_bytes - out.device_peak_bytes)} more device memory")
    b = res["batch"] if res["batch"].fits(hw) else res["batch_acc"]
    key = "batch" if res["batch"].fits(hw) else "batch_acc"
    bp = tasks[key][2]
    if b.fits(hw) and b.tokens_per_s >= out.tokens_per_s * (1 + MIN_GAIN):
        how = "" if key == "batch" else f" in {bp.micro_batches} micro-batches"
        lines.append(f"a bigger batch raises throughput: batch {bp.batch}{how} would give "
                     f"{b.tokens_per_s:,.0f} tokens/s (+{b.tokens_per_s / out.tokens_per_s - 1:.0%}), "
                     f"MFU {out.mfu:.1%} -> {b.mfu:.1%} ({policy_flags(bp, policy)})")
    lo = res.get("layer")
    if lo is not None and lo.fits(hw) and gain(lo) >= MIN_GAIN:
        lines.append(f"--mb-order layer (every micro-batch passes a unit while its weights are on the device: "
                     f"they load once, not once per micro-batch) would {_pct(lo.step_time_s, t0)}, using "
                     f"{fmt_bytes(max(0, lo.device_peak_bytes - out.device_peak_bytes))} more device memory")
    if "pipelined" in res and gain(res["pipelined"]) >= MIN_GAIN:
        lines.append(f"--optimizer pipelined (same exact clipping) would {_pct(res['pipelined'].step_time_s, t0)}")
    a = res.get("adam")
    if a is not None and gain(a) >= MIN_GAIN:
        lines.append(f"a host with twice the AdamW rate ({2 * hw.host.adam_Gparams_per_s:g}e9 params/s: more "
                     f"cores, faster DRAM) would {_pct(a.step_time_s, t0)}")
    if not lines:
        lines.append(f"the step is limited by {out.bottleneck}; none of the usual changes (faster link, "
                     f"checkpoint placement, bigger batch, faster host optimizer) moves it by {MIN_GAIN:.0%}")
    return lines
