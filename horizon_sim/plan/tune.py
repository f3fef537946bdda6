"""tune(): the fastest policy that fits a machine, by hill climbing over the policy knobs.

Knobs searched (SearchSpace): sequences per micro-batch, micro-batches per step, checkpoint
interval K, device weight slots, where checkpoints live, when the optimizer runs, the host
working copy, the order micro-batches pass the units (with more than one), and how many of
the last layers keep their activations (no recompute). Precision and clipping are the user's (they change the numerics), except
that optimizer='backward' is tried only when clipping is already off (grad_clip=0).

Search: best-improvement hill climbing from two seeds (the default policy and a memory-lean
one). A neighbour changes one knob by one step (ordered knobs) or to another value
(categorical knobs), or trades micro-batch size for micro-batches at equal batch. Configs that
fit rank by tokens/s; configs that do not, by how far over the tighter memory they are, so the
climb walks into the feasible region first. Every neighbour of a round is simulated in
parallel; typical searches simulate 50-150 configurations.
"""
import math
from dataclasses import dataclass, replace

import pandas as pd

from horizon_sim.errors import HorizonError
from horizon_sim.plan.outcome import Outcome, round_up_ram
from horizon_sim.plan.runner import Runner
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import ADAPTER_PLACES, CKPT_PLACES, KEEP_ALL, MB_ORDERS, OPTIMIZER_MODES, Policy

KNOBS = ("micro_batch", "micro_batches", "act_ckpt_every", "slots", "act_ckpt_on", "optimizer", "working_copy",
         "max_host_grads", "split_master", "mb_order", "keep_last", "adapters_on")
_ORDERED = ("micro_batch", "micro_batches", "act_ckpt_every", "slots", "max_host_grads", "keep_last")
TIE = 0.005
"""Configurations within this fraction of the fastest count as equally fast: the best is then
the one with the smallest batch, then the smallest host and device footprint."""


def _positive_ints(name, vals):
    vals = tuple(vals)
    if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in vals):
        raise HorizonError(f"search space {name}={vals!r} must be a non-empty list of positive integers")
    return tuple(sorted(set(vals)))


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """The values tune() may choose for each knob."""

    micro_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    """Sequences per micro-batch."""
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    """Micro-batches per step (more amortize the once-per-step optimizer)."""
    act_ckpt_every: tuple[int, ...] = (1, 2, 4, 8)
    slots: tuple[int, ...] = (2, 3, 4)
    act_ckpt_on: tuple[str, ...] = CKPT_PLACES
    optimizer: tuple[str, ...] = ("pipelined", "backward", "after")
    working_copy: tuple[bool, ...] = (True, False)
    max_host_grads: tuple[int, ...] = (0, 2, 8)
    """Bounds on the host gradients waiting for optimizer='backward' with one micro-batch (0 = none)."""
    split_master: tuple[bool, ...] = (False, True)
    """The exact fp32 master whole, or split into the working copy + a low half (with the copy,
    an fp32 master and bf16 compute only)."""
    mb_order: tuple[str, ...] = MB_ORDERS
    """The micro-batch orders (Policy.mb_order; one micro-batch: only 'micro', the same step)."""
    keep_last: tuple[int, ...] = (0, 1, 2, 4, 8, 16, KEEP_ALL)
    """How many of the last layers keep their activations (Policy.keep_last; KEEP_ALL: every
    layer; values above the model's depth are dropped)."""
    adapters_on: tuple[str, ...] = ADAPTER_PLACES
    """Where adapters live (Policy.adapters_on; searched only with adapters)."""
    max_batch: int = 64
    """Cap on sequences per step (micro_batch x micro_batches): the batch is a training
    hyperparameter, not only a speed knob."""
    batch: int | None = None
    """Sequences per step, fixed (the user's batch: `tune --batch`): only its splits into
    micro_batch x micro_batches are searched (micro_batches from the values above that divide
    it). None: any batch up to max_batch."""
    bound_pinned: bool = False
    """max_host_grads is the user's bound (pinned.py: with the optimizer in backward and one
    micro-batch, where it always applies): no 0 is added for states it does not apply to."""

    def __post_init__(self):
        for f in ("micro_batch", "micro_batches", "act_ckpt_every"):
            object.__setattr__(self, f, _positive_ints(f, getattr(self, f)))
        object.__setattr__(self, "slots", _positive_ints("slots", self.slots))
        hg = tuple(self.max_host_grads)
        if not hg or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in hg):
            raise HorizonError(f"search space max_host_grads={hg!r} must be integers >= 0")
        if not self.bound_pinned:  # 0: where no bound applies
            object.__setattr__(self, "max_host_grads", tuple(sorted(set(hg) | {0})))
        if min(self.slots) < 2:
            raise HorizonError(f"search space slots={self.slots!r} must all be >= 2")
        for f, allowed in (("act_ckpt_on", CKPT_PLACES), ("optimizer", OPTIMIZER_MODES), ("mb_order", MB_ORDERS),
                           ("adapters_on", ADAPTER_PLACES)):
            vals = tuple(getattr(self, f))
            if not vals or any(v not in allowed for v in vals):
                raise HorizonError(f"search space {f}={vals!r}; allowed: {', '.join(allowed)}")
            object.__setattr__(self, f, vals)
        kl = tuple(self.keep_last)
        if not kl or any(isinstance(v, bool) or not isinstance(v, int) or v < KEEP_ALL for v in kl):
            raise HorizonError(f"search space keep_last={kl!r} must be numbers of layers >= 0 or {KEEP_ALL} (all)")
        object.__setattr__(self, "keep_last", tuple(sorted(set(kl))))
        if not self.working_copy:
            raise HorizonError("search space working_copy must hold True, False or both")
        if not self.split_master or any(not isinstance(v, bool) for v in self.split_master):
            raise HorizonError(f"search space split_master={tuple(self.split_master)!r} must hold True, False or both")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch <= 0:
            raise HorizonError(f"max_batch={self.max_batch!r} must be a positive integer")
        if self.batch is not None:
            b = self.batch
            if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
                raise HorizonError(f"batch={b!r} must be a positive integer (sequences per step)")
            ns = tuple(n for n in self.micro_batches if b % n == 0) or (1,)
            object.__setattr__(self, "micro_batches", ns)
            object.__setattr__(self, "micro_batch", tuple(sorted({b // n for n in ns})))
            object.__setattr__(self, "max_batch", b)


@dataclass(frozen=True)
class TuneResult:
    table: pd.DataFrame
    """Every configuration simulated: the best first, then those that fit by tokens/s, then the rest."""
    best: Policy | None
    """The fastest policy that fits; None when nothing in the search space fits."""
    pareto: pd.DataFrame
    """For each RAM size (64 GiB steps) that buys speed, the fastest configuration that fits the
    device: not beaten on both tokens/s and RAM to install; may include sizes above this machine's."""
    baseline: dict
    """The row of the base policy (the default, unless given) for comparison."""
    evaluated: int

    def top(self, n: int = 10) -> pd.DataFrame:
        """The n fastest that fit, leaving out twins that only cost more memory."""
        return _drop_twins(self.table[self.table.fits]).head(n).reset_index(drop=True)


def _near(vals, v):
    return min(vals, key=lambda x: (abs(x - v), x))


class HillClimb:
    """Hill climbing over the policy space (tune's search): each round simulates every neighbour
    of the current state (one knob moved one step) through the shared runner and moves to the
    best, until no neighbour scores higher; every state simulated is kept in `seen`."""

    def __init__(self, model, hw, base, space, runner):
        self.model, self.hw, self.base, self.space, self.runner = model, hw, base, space, runner
        self.L = model.n_layers
        opts = [o for o in space.optimizer if o != "backward" or base.grad_clip == 0]
        wcs = [w for w in space.working_copy if not w or base.compute_dtype != base.master_dtype]
        if not opts:
            raise HorizonError("search space leaves no optimizer mode: 'backward' needs grad_clip=0")
        if not wcs:
            raise HorizonError("search space allows only working_copy=True, which duplicates the "
                               "master weights when compute_dtype equals master_dtype")
        self.values = {"micro_batch": space.micro_batch, "micro_batches": space.micro_batches,
                       "act_ckpt_every": tuple(k for k in space.act_ckpt_every if k <= self.L) or (self.L,),
                       "slots": space.slots, "act_ckpt_on": space.act_ckpt_on, "optimizer": tuple(opts),
                       "working_copy": tuple(wcs), "max_host_grads": space.max_host_grads,
                       "split_master": tuple(v for v in space.split_master if not v or self._can_split(base)) or (False,),
                       "mb_order": space.mb_order,
                       # layer counts, 'all' as the model's depth, so the knob is ordered
                       "keep_last": tuple(sorted({self.L if k == KEEP_ALL else k for k in space.keep_last
                                                  if k <= self.L})),
                       "adapters_on": tuple(space.adapters_on) if base.adapters else (base.adapters_on,)}
        self.seen: dict[tuple, Outcome] = {}

    @staticmethod
    def _can_split(p: Policy) -> bool:
        return (p.master_dtype, p.compute_dtype) == ("fp32", "bf16")

    def policy(self, s: tuple) -> Policy:
        mb, n, k, slots, on, opt, wc, hg, split, order, keep, place = s
        return replace(self.base, batch=mb * n, micro_batches=n, act_ckpt_every=k, slots=slots,
                       act_ckpt_on=on, optimizer=opt, working_copy=wc, max_host_grads=hg, split_master=split,
                       mb_order=order, keep_last=keep, adapters_on=place)

    @staticmethod
    def _bounds_apply(s: tuple) -> bool:
        return s[5] == "backward" and s[1] == 1

    def _one_order(self, s: tuple) -> tuple:
        """One micro-batch: both orders are the same step; keep the first one searched."""
        first = self.values["mb_order"][0]
        return s if s[1] > 1 or s[9] == first else s[:9] + (first,) + s[10:]

    def valid(self, s: tuple) -> bool:
        return (s[0] * s[1] <= self.space.max_batch and s[2] <= self.L
                and (self.space.batch is None or s[0] * s[1] == self.space.batch)
                and (s[7] == 0 or self._bounds_apply(s)) and (not s[8] or s[6])  # a split master is the copy
                and s == self._one_order(s))

    def project(self, p: Policy) -> tuple:
        """The nearest state of the space to a policy."""
        v = self.values
        s = [_near(v["micro_batch"], p.micro_batch), _near(v["micro_batches"], p.micro_batches),
             _near(v["act_ckpt_every"], p.act_ckpt_every), _near(v["slots"], p.slots),
             p.act_ckpt_on if p.act_ckpt_on in v["act_ckpt_on"] else v["act_ckpt_on"][0],
             p.optimizer if p.optimizer in v["optimizer"] else v["optimizer"][0],
             p.working_copy if p.working_copy in v["working_copy"] else v["working_copy"][0],
             _near(v["max_host_grads"], p.max_host_grads),
             p.split_master if p.split_master in v["split_master"] else v["split_master"][0],
             p.mb_order if p.mb_order in v["mb_order"] else v["mb_order"][0],
             _near(v["keep_last"], p.kept_layers(self.L)),
             p.adapters_on if p.adapters_on in v["adapters_on"] else v["adapters_on"][0]]
        if not self._bounds_apply(s):
            s[7] = 0
        if not s[6]:
            s[8] = False
        if self.space.batch is not None:  # the batch is fixed: its split nearest the policy's
            s[1] = _near(v["micro_batches"], p.micro_batches)
            s[0] = self.space.batch // s[1]
        while s[0] * s[1] > self.space.max_batch:  # shrink the larger factor first
            i = 0 if s[0] >= s[1] and s[0] > v["micro_batch"][0] else 1
            idx = v[KNOBS[i]].index(s[i])
            if idx == 0:
                break
            s[i] = v[KNOBS[i]][idx - 1]
        return self._one_order(tuple(s))

    def neighbours(self, s: tuple) -> list[tuple]:
        out = []
        for i, knob in enumerate(KNOBS):
            vals = self.values[knob]
            if knob in _ORDERED:
                j = vals.index(s[i])
                cands = [vals[j + d] for d in (-1, 1) if 0 <= j + d < len(vals)]
            else:
                cands = [v for v in vals if v != s[i]]
            for c in cands:
                out.append(s[:i] + (c,) + s[i + 1:])
        mbs, ns = self.values["micro_batch"], self.values["micro_batches"]
        i, j = mbs.index(s[0]), ns.index(s[1])
        for di, dj in ((1, -1), (-1, 1)):  # same batch, split differently
            if 0 <= i + di < len(mbs) and 0 <= j + dj < len(ns):
                out.append((mbs[i + di], ns[j + dj]) + s[2:])
        if not s[6] and True in self.values["split_master"] and True in self.values["working_copy"]:
            out.append(s[:6] + (True,) + s[7:8] + (True,) + s[9:])  # no copy -> the split master (same bytes)
        # a move into a mode the bound does not apply to drops the bound
        out = [t if t[7] == 0 or self._bounds_apply(t) else t[:7] + (0,) + t[8:] for t in out]
        out = [t if t[6] or not t[8] else t[:8] + (False,) + t[9:] for t in out]  # no copy: no split master
        out = [self._one_order(t) for t in out]
        return [t for t in dict.fromkeys(out) if self.valid(t)]

    def score(self, s: tuple) -> tuple:
        o = self.seen[s]
        if o.fits(self.hw):
            return (1, o.tokens_per_s, -o.host_bytes)
        return (0, -o.shortfall(self.hw), 0)

    def evaluate(self, states) -> None:
        new = [s for s in dict.fromkeys(states) if s not in self.seen]
        outs = self.runner.run([(self.model, self.hw, self.policy(s)) for s in new])
        self.seen.update(zip(new, outs))

    def climb(self, start: tuple, max_rounds: int) -> tuple:
        self.evaluate([start])
        cur = start
        for _ in range(max_rounds):
            nb = self.neighbours(cur)
            self.evaluate(nb)
            best = max(nb, key=self.score, default=cur)
            if self.score(best) <= self.score(cur):
                break
            cur = best
        return cur


def lean_policy(base: Policy, model: ModelSpec) -> Policy:
    """A small-footprint starting point: the base micro-batch, no accumulation, checkpoints on the host
    every 4 layers, no working copy, the optimizer in backward when clipping is off."""
    return replace(base, batch=base.micro_batch, micro_batches=1, act_ckpt_every=min(4, model.n_layers), slots=2,
                   act_ckpt_on="host", working_copy=False, split_master=False,
                   optimizer="backward" if base.grad_clip == 0 else "after")


def _row(model, hw, p: Policy, o: Outcome) -> dict:
    return {"batch": p.batch, "micro_batches": p.micro_batches, "micro_batch": p.micro_batch,
            "act_ckpt_every": p.act_ckpt_every, "slots": p.slots, "act_ckpt_on": p.act_ckpt_on,
            "optimizer": p.optimizer, "working_copy": p.working_copy, "max_host_grads": p.max_host_grads,
            "split_master": p.split_master, "mb_order": p.mb_order, "keep_last": p.keep_last,
            "adapters_on": p.adapters_on, "fits": o.fits(hw),
            "tokens_per_s": o.tokens_per_s, "step_time_s": o.step_time_s, "mfu": o.mfu,
            "device_peak_bytes": o.device_peak_bytes, "host_bytes": o.host_bytes,
            "ram_needed_bytes": round_up_ram(o.ram_needed_bytes(hw)) if o.ok else 0,
            "bottleneck": o.bottleneck, "why_not": o.why_not(hw), "shortfall": o.shortfall(hw), "policy": p}


def pareto_front(df: pd.DataFrame, by: str = "ram_needed_bytes") -> pd.DataFrame:
    """Rows not beaten on both `by` (lower: the RAM to install, in 64 GiB steps, by default) and
    tokens_per_s (higher): the fastest configuration at each RAM size that buys speed, by RAM."""
    d = df.sort_values([by, "tokens_per_s", "host_bytes"], ascending=[True, False, True], kind="stable")
    keep, best = [], -math.inf
    for idx, tps in zip(d.index, d.tokens_per_s):
        if tps > best:
            keep.append(idx)
            best = tps
    return d.loc[keep].reset_index(drop=True)


def _drop_twins(df: pd.DataFrame, rel: float = 1e-3) -> pd.DataFrame:
    """Drop rows as fast as (within `rel`) a row ranked above them that needs no more device
    and host memory: e.g. a third slot that buys nothing."""
    keep = []
    for i, r in enumerate(df.itertuples()):
        if not any(k.tokens_per_s >= r.tokens_per_s * (1 - rel) and k.device_peak_bytes <= r.device_peak_bytes
                   and k.host_bytes <= r.host_bytes for k in keep):
            keep.append(r)
    return df.loc[[k.Index for k in keep]]


def tune(model: ModelSpec, hw: HardwareSpec, seq: int = 2048, *, base: Policy | None = None,
         space: SearchSpace | None = None, workers: int | None = None, progress: bool = False,
         max_rounds: int = 20, runner: Runner | None = None) -> TuneResult:
    """Search the policy knobs for the highest tokens/s that fits `hw`. `base` fixes what is
    not searched (precision, clipping, attention) and is the baseline; its seq is replaced by
    `seq`. Pass grad_clip=0 in `base` to let the search use optimizer='backward'."""
    if isinstance(seq, bool) or not isinstance(seq, int) or seq <= 0:
        raise HorizonError(f"seq={seq!r} must be a positive integer")
    base = replace(base or Policy(), seq=seq)
    if space is not None and space.batch is not None and base.batch != space.batch:  # the baseline trains it too
        base = replace(base, batch=space.batch, micro_batches=1)
    space = space or SearchSpace()
    own = runner is None
    runner = runner or Runner(workers, progress, desc=f"tune {model.name}")
    try:
        c = HillClimb(model, hw, base, space, runner)
        base_out = runner.one(model, hw, base)
        seeds = [s for s in (c.project(base), c.project(lean_policy(base, model))) if c.valid(s)]
        if not seeds:
            raise HorizonError(f"the search space has no configuration with at most max_batch="
                               f"{space.max_batch} sequences per step")
        for s in dict.fromkeys(seeds):
            c.climb(s, max_rounds)
    finally:
        if own:
            runner.close()
    rows = [_row(model, hw, c.policy(s), o) for s, o in c.seen.items() if o.ok]
    in_space = c.policy(c.project(base)) == base
    if not in_space and base_out.ok:  # compare against the base even when the space lacks it
        rows.append(_row(model, hw, base, base_out))
    if not rows:
        raise HorizonError(f"no configuration of the search space could be simulated for {model.name}: "
                           f"{base_out.error or next(iter(c.seen.values())).error}")
    table = pd.DataFrame(rows)
    table = table.sort_values(["fits", "tokens_per_s", "host_bytes", "device_peak_bytes"],
                              ascending=[False, False, True, True],
                              kind="stable").reset_index(drop=True)
    if bool(table.fits.iloc[0]):  # within TIE of the fastest, prefer the smaller batch and footprint
        floor = table.tokens_per_s.iloc[0] * (1 - TIE)
        if base_out.fits(hw):  # never below the base policy
            floor = max(floor, base_out.tokens_per_s)
        near = table[table.fits & (table.tokens_per_s >= floor)]
        pick = near.sort_values(["batch", "host_bytes", "device_peak_bytes"], kind="stable").index[0]
        table = pd.concat([table.loc[[pick]], table.drop(index=pick)]).reset_index(drop=True)
    fits_dev = table[table.device_peak_bytes <= hw.device_bytes_usable]
    pareto = pareto_front(fits_dev) if len(fits_dev) else fits_dev
    best = table.policy.iloc[0] if bool(table.fits.iloc[0]) else None
    return TuneResult(table=table, best=best, pareto=pareto, baseline=_row(model, hw, base, base_out),
                      evaluated=len(c.seen) + (0 if in_space else 1))
