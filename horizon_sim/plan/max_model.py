"""max_model(): the largest model that trains on a machine.

Candidates (kind 'dense', the default): every dense model preset, plus the dense-120b family scaled in depth (its 12288-wide
block, 2 to as many layers as could possibly fit, in steps of 2, up to the planner's MAX_LAYERS) and in width (its 76 layers,
width 1024 to 32768 in steps of 1024, 128-wide heads, 8 kv heads, SwiGLU 8/3 x width). Each is
judged under a policy set: 'default' (Policy() alone) or 'lean' (the default plus three
memory-lean policies; the fastest that fits counts).

Kind 'moe': the MoE presets, plus the qwen3-235b-a22b family (128 experts, top-8) scaled in
depth the same way ('moe-depth'). The kinds are kept apart because an MoE model of N total
parameters trains about as fast as a dense one of its active parameters: "the largest model"
means something else for each, and a dense answer should not turn into an MoE one unasked.

Candidates are scanned from the largest down. A candidate whose host store alone (master
weights, moments, working copy, process runtime: a lower bound of the footprint) or weight
slots alone exceed the machine is rejected without simulating; the rest are simulated, in
parallel batches. The first that fits is the answer, so every bigger candidate was shown not
to fit.
"""
import math
from dataclasses import dataclass, replace

import pandas as pd

from horizon_sim.errors import HorizonError
from horizon_sim.plan.advice import BOUNDED_HOST_GRADS
from horizon_sim.plan.outcome import Outcome
from horizon_sim.plan.runner import Runner
from horizon_sim.schedule.limits import MAX_LAYERS
from horizon_sim.specs.quant import base_bytes
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import PRESETS
from horizon_sim.specs.policy import DTYPE_BYTES, Policy
from horizon_sim.units import GiB, closest, fmt_bytes

_WHOLE = dict(working_copy=False, split_master=False)
"""No working copy: the whole master (a split master's high half is the copy; the default
policy, split, has to be told)."""
_LEAN = {
    "bf16-moments": dict(_WHOLE, states_dtype="bf16"),
    "lean": dict(_WHOLE, optimizer="backward", grad_clip=0.0),
    "leanest": dict(_WHOLE, optimizer="backward", grad_clip=0.0, states_dtype="bf16"),
    "split": dict(split_master=True),
    "split-lean": dict(split_master=True, optimizer="backward", grad_clip=0.0, max_host_grads=BOUNDED_HOST_GRADS),
}
_DISK = {"split-disk": dict(_LEAN["split-lean"], disk_tier="moments"),
         "split-disk-low": dict(_LEAN["split-lean"], disk_tier="moments+low")}
"""Tried too when the machine has a disk tier (--disk): the split-lean policy with the Adam
moments on disk, and with the master's low halves there too."""
POLICY_CHANGES = {**_LEAN, **_DISK}
"""Every named policy max-model tries, as its changes to the base policy."""
POLICY_SETS = {"default": ("default",), "lean": ("default", *_LEAN),
               "exact": ("default", "lean", "split", "split-lean")}
"""Named policies tried per candidate: 'default' is the base policy; the lean ones change the
optimizer mode (no clipping; host gradients bounded with the split master), the working copy,
the master's form (split: the exact fp32 master as its bf16 working copy + a low half) and the
moments' precision. 'exact': only those with an fp32 master and fp32 moments (AdamW as torch
computes it in fp32)."""

FAMILY_BASE = "dense-120b"
MOE_FAMILY_BASE = "qwen3-235b-a22b"
KINDS = ("dense", "moe")
WIDTHS = range(1024, 32768 + 1, 1024)


def exact_sets(base: Policy | None = None) -> dict[str, dict[str, Policy]]:
    """The exact-fp32 policy sets compared side by side (benchmarks/host_bytes.py, reports
    section 8): 'before' the split master (the base policy with the whole fp32 master, and the
    lean policy: no working copy, loads move fp32), '+ split' (and the split master, also lean
    with bounded host grads), '+ disk' (and the split master with the moments on disk)."""
    base = base or Policy()
    before = {"default": replace(base, split_master=False), "lean": replace(base, **_LEAN["lean"])}
    split = {**before, **{n: replace(base, **_LEAN[n]) for n in ("split", "split-lean")}}
    disk = {n: replace(base, **kw) for n, kw in _DISK.items()}
    return {"before": before, "+ split": split, "+ disk": {**split, **disk}}


def policy_set(name: str, base: Policy | None = None, disk: bool = False) -> dict[str, Policy]:
    """The named set's policies; disk: with the disk-tier ones (not in 'default')."""
    if name not in POLICY_SETS:
        raise HorizonError(f"unknown policy set {name!r}{closest(name, POLICY_SETS)}; "
                           f"allowed: {', '.join(POLICY_SETS)}")
    base = base or Policy()
    names = POLICY_SETS[name] + (tuple(_DISK) if disk and name != "default" else ())
    return {n: (base if n == "default" else replace(base, **POLICY_CHANGES[n])) for n in names}


@dataclass(frozen=True, slots=True)
class Candidate:
    model: ModelSpec
    family: str
    """'preset', 'depth' (dense-120b scaled in n_layers), 'width' (scaled in hidden) or
    'moe-depth' (qwen3-235b-a22b scaled in n_layers)."""

    @property
    def params(self) -> int:
        return self.model.total_params


def _wide(base: ModelSpec, hidden: int) -> ModelSpec:
    ffn = math.ceil(hidden * 8 / 3 / 256) * 256
    return replace(base, name=f"{base.name}-w{hidden}", hidden=hidden, n_heads=hidden // 128,
                   ffn_hidden=ffn)


def host_lower_bound(model: ModelSpec, policy: Policy, hw: HardwareSpec) -> int:
    """Host bytes a node cannot go below: its share of the master weights and Adam moments
    (1/M of them on M nodes; the moments not when on disk), the working copy, a runtime per device."""
    c = hw.cluster
    if policy.adapters:  # the frozen base (in the compute dtype, or its blocks quantized), nothing else
        return (base_bytes(model, policy.base_quant, policy.compute_dtype)
                + c.layout.devices_per_node * int(hw.host.runtime_overhead_GiB * GiB))
    state = policy.master_bytes + (0 if policy.disk_tier != "none" else 2 * DTYPE_BYTES[policy.states_dtype])
    wc = DTYPE_BYTES[policy.compute_dtype] if policy.working_copy else 0
    return (model.total_params * state // c.layout.nodes + model.total_params * wc
            + c.layout.devices_per_node * int(hw.host.runtime_overhead_GiB * GiB))


def device_lower_bound(model: ModelSpec, policy: Policy) -> int:
    """Device bytes no schedule can go below: its weight slots."""
    return policy.slots * max(model.max_layer_params, model.head_device_params) * DTYPE_BYTES[policy.compute_dtype]


def disk_lower_bound(model: ModelSpec, policy: Policy) -> int:
    """Disk bytes of the disk tier: the moments (0 without one)."""
    return model.total_params * policy.disk_bytes_per_param


def _bound_ok(model, policy, hw) -> bool:
    return (host_lower_bound(model, policy, hw) <= hw.host_bytes_usable
            and device_lower_bound(model, policy) <= hw.device_bytes_usable
            and disk_lower_bound(model, policy) <= hw.disk_bytes_usable)


def candidates(hw: HardwareSpec, policies: dict[str, Policy], kind: str = "dense") -> list[Candidate]:
    """Presets and the dense-120b family (kind 'moe': the MoE presets and the qwen3-235b-a22b
    family in depth), smallest first (a depth family stops one step past the last depth whose
    lower bound fits)."""
    if kind not in KINDS:
        raise HorizonError(f"unknown model kind {kind!r}; allowed: {', '.join(KINDS)}")
    moe = kind == "moe"
    base = PRESETS[MOE_FAMILY_BASE if moe else FAMILY_BASE]
    out = {m.name: Candidate(m, "preset") for m in PRESETS.values() if m.is_moe == moe}
    for L in range(2, MAX_LAYERS + 1, 2):
        m = replace(base, name=f"{base.name}-L{L}", n_layers=L)
        if L != base.n_layers:
            out[m.name] = Candidate(m, "moe-depth" if moe else "depth")
        if not any(_bound_ok(m, p, hw) for p in policies.values()):
            break
    for h in () if moe else WIDTHS:
        if h != base.hidden:
            m = _wide(base, h)
            out[m.name] = Candidate(m, "width")
    return sorted(out.values(), key=lambda c: (c.params, c.model.name))


@dataclass(frozen=True)
class Verdict:
    candidate: Candidate
    fits: bool
    policy_name: str
    """The fastest policy that fits (or, when none fits, the one that comes closest)."""
    policy: Policy
    outcome: Outcome | None
    """None when rejected by the lower bound without simulating."""
    why: str

    def row(self) -> dict:
        o = self.outcome
        return {"model": self.candidate.model.name, "family": self.candidate.family,
                "params": self.candidate.params, "n_layers": self.candidate.model.n_layers,
                "hidden": self.candidate.model.hidden, "fits": self.fits, "policy": self.policy_name,
                "tokens_per_s": o.tokens_per_s if o else math.nan, "mfu": o.mfu if o else math.nan,
                "device_peak_bytes": o.device_peak_bytes if o else 0, "host_bytes": o.host_bytes if o else 0,
                "why": self.why}


@dataclass(frozen=True)
class MaxModelResult:
    best: Verdict
    """The largest candidate that fits."""
    next_bigger: Verdict | None
    """The smallest candidate bigger than `best` (it does not fit); None if there is none."""
    largest_preset: Verdict | None
    """The largest preset that fits (may be `best` itself)."""
    table: pd.DataFrame
    """Every candidate judged, largest first."""

    @property
    def model(self) -> ModelSpec:
        return self.best.candidate.model

    @property
    def params(self) -> int:
        return self.best.candidate.params


def _judge(cands: list[Candidate], policies: dict[str, Policy], hw, runner: Runner) -> list[Verdict]:
    tasks, index = [], []
    for ci, c in enumerate(cands):
        for name, p in policies.items():
            if _bound_ok(c.model, p, hw):
                tasks.append((c.model, hw, p))
                index.append((ci, name))
    outs = runner.run(tasks)
    by_cand: dict[int, list] = {}
    for (ci, name), o in zip(index, outs):
        by_cand.setdefault(ci, []).append((name, o))
    verdicts = []
    for ci, c in enumerate(cands):
        tried = by_cand.get(ci, [])
        fit = [(o.tokens_per_s, name, o) for name, o in tried if o.fits(hw)]
        if fit:
            tps, name, o = max(fit, key=lambda t: t[0])
            verdicts.append(Verdict(c, True, name, policies[name], o, "fits"))
        elif tried:
            name, o = min(tried, key=lambda t: t[1].shortfall(hw))
            verdicts.append(Verdict(c, False, name, policies[name], o, o.why_not(hw)))
        else:
            name, p = min(policies.items(), key=lambda kv: host_lower_bound(c.model, kv[1], hw))
            hb, db = host_lower_bound(c.model, p, hw), device_lower_bound(c.model, p)
            kb = disk_lower_bound(c.model, p)
            why = (f"host store alone needs {fmt_bytes(hb)} of {fmt_bytes(hw.host_bytes_usable)} usable"
                   if hb > hw.host_bytes_usable else
                   f"weight slots alone need {fmt_bytes(db)} of {fmt_bytes(hw.device_bytes_usable)} usable"
                   if db > hw.device_bytes_usable else
                   f"the moments on disk alone need {fmt_bytes(kb)} of {fmt_bytes(hw.disk_bytes_usable)}")
            verdicts.append(Verdict(c, False, name, p, None, why))
    return verdicts


def judge(model: ModelSpec, hw: HardwareSpec, policies: dict[str, Policy], runner: Runner) -> Verdict:
    """One model under a policy set, as max-model judges its candidates: the fastest policy that
    fits, or the one that comes closest."""
    return _judge([Candidate(model, "preset")], policies, hw, runner)[0]


def max_model(hw: HardwareSpec, *, base: Policy | None = None, policies: str | dict = "lean",
              workers: int | None = None, progress: bool = False, kind: str = "dense") -> MaxModelResult:
    """The largest candidate model of `kind` ('dense' or 'moe', by total parameters) that fits
    `hw` under the policy set `policies` (a name of POLICY_SETS, or {name: Policy})."""
    if base is not None and base.adapters and not isinstance(policies, dict):
        # the lean sets change the host update, which a frozen base has not; the adapters' place is tried both ways
        policies = {"lora": base} if base.adapters_on == "host" else \
            {"lora": base, "lora-host": replace(base, adapters_on="host")}
    pols = dict(policies) if isinstance(policies, dict) else policy_set(policies, base, disk=hw.disk_bytes_usable > 0)
    if not pols:
        raise HorizonError("max-model needs at least one policy")
    cands = candidates(hw, pols, kind)
    judged: list[Verdict] = []
    with Runner(workers, progress, desc="max-model") as runner:
        batch = max(2, runner.workers)
        rest = list(reversed(cands))  # largest first
        best = None
        while rest and best is None:
            chunk, rest = rest[:batch], rest[batch:]
            for v in _judge(chunk, pols, hw, runner):
                judged.append(v)
                if v.fits:
                    best = v
                    break
        if best is None:
            raise HorizonError(f"no candidate model fits {hw.name or hw.device.name}, not even "
                               f"{cands[0].model.name} ({cands[0].params / 1e6:.1f}M params): {judged[-1].why}")
        judged = [v for v in judged if v.candidate.params >= best.candidate.params]
        bigger = [v for v in judged if v.candidate.params > best.candidate.params]
        next_bigger = min(bigger, key=lambda v: (v.candidate.params, v.candidate.model.name), default=None)
        preset = best if best.candidate.family == "preset" else None
        presets_left = [c for c in reversed(cands) if c.family == "preset" and c.params < best.candidate.params]
        for c in presets_left:
            if preset is not None:
                break
            v = _judge([c], pols, hw, runner)[0]
            judged.append(v)
            if v.fits:
                preset = v
    table = pd.DataFrame([v.row() for v in judged]).sort_values("params", ascending=False, kind="stable")
    return MaxModelResult(best=best, next_bigger=next_bigger, largest_preset=preset,
                          table=table.reset_index(drop=True))
