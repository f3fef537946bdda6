"""Plan every published row on the setup its source ran, and set the prediction beside the
published figure: per row predicted, published and error; per quantity group the median
|error|; rows the planner cannot model listed with the reason.

    res = run_suite(load_rows())
    print(res.text())
"""
import argparse
import shlex
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from horizon_sim.errors import HorizonError
from horizon_sim.published.quantity import GROUPS, QUANTITIES, error
from horizon_sim.published.rows import PublishedRow
from horizon_sim.sim.simulate import SimResult
from horizon_sim.specs.model import ModelSpec


class _Parser(argparse.ArgumentParser):
    """`horizon plan`'s parser, raising instead of exiting: a bad row is an error naming it."""

    def error(self, message):
        raise HorizonError(message)


def _plan_parser() -> argparse.ArgumentParser:
    from horizon_sim.cli import plan_cmd
    p = _Parser(prog="horizon plan", add_help=False)
    plan_cmd.configure(p)
    return p


def plan_row(row: PublishedRow) -> tuple[SimResult, ModelSpec]:
    """The planner's step for the row's setup, built as `horizon plan` builds it from the same
    flags: Horizon's plan, or the ZeRO-3-offload peer's."""
    from horizon_sim.cli import plan_cmd
    from horizon_sim.cli.policy_args import policy_from_args
    from horizon_sim.plan.families import family
    from horizon_sim.schedule.op import Family
    from horizon_sim.specs.hf_config import load_model

    a = _plan_parser().parse_args(shlex.split(row.plan))
    if a.hardware or a.compare or a.json or a.sources:
        raise HorizonError("plan flags --hardware, --compare, --json and --sources have no place in a row "
                           "(the row names its machine; system picks the peer)")
    fam = family(row.system)
    if fam.name == Family.HORIZON and a.peer_knobs:
        raise HorizonError("--peer-knobs is for a peer's rows (system = 'zero3-offload' or 'zero2-offload')")
    model = ModelSpec.from_dict({"name": row.id, **row.model}, f"row {row.id} model") if row.model else load_model(a.model)
    hw = plan_cmd.machine_from_args(a)
    policy = policy_from_args(a, hw)
    if fam.name != Family.HORIZON:
        policy = plan_cmd.peer_policy_from_args(a, policy, fam.name.value)
    return fam.plan(model, hw, policy), model

COLUMNS = ["id", "source", "system", "quantity", "unit", "published", "predicted", "error", "planned_fits",
           "assumed", "status", "cite", "held_out", "entered", "memory_figure"]


@dataclass(frozen=True)
class SuiteResult:
    table: pd.DataFrame
    """One row per published figure (COLUMNS); status 'ok', or why it was not compared;
    planned_fits: the planner's verdict on the setup (a speed predicted for a setup it says does
    not fit is still shown, marked); assumed: what the row assumes that its source leaves out."""

    @property
    def compared(self) -> pd.DataFrame:
        return self.table[self.table.status == "ok"]

    def medians(self, held_out: bool | None = False) -> dict[str, dict]:
        """Per quantity group: rows compared, median and worst |error| (for 'fit': verdicts
        wrong), of the held-out rows, of the others, or (None) of all of them together."""
        out = {}
        c = self.compared if held_out is None else self.compared[self.compared.held_out == held_out]
        for g in GROUPS:
            t = c[c.quantity.map(lambda q: QUANTITIES[q].group) == g]
            if len(t):
                e = t.error.abs()
                out[g] = {"rows": len(t), "median_abs_err": float(e.median()), "max_abs_err": float(e.max()),
                          "wrong": int((e > 0).sum()) if g == "fit" else None}
        return out

    def figures(self) -> dict:
        t = self.table
        return {"rows": len(t), "compared": len(self.compared), "sources": int(t.source.nunique()),
                "sources_compared": int(self.compared.source.nunique()), "groups": self.medians(),
                "held_out_rows": int(t.held_out.sum()), "held_out_groups": self.medians(held_out=True),
                "all_groups": self.medians(held_out=None)}

    def text(self) -> str:
        f = self.figures()
        lines = [f"published measurements: {f['rows']} rows from {f['sources']} sources; "
                 f"{f['compared']} compared ({f['sources_compared']} sources), "
                 f"{f['rows'] - f['compared']} not (reasons below)"]
        sections = [("", f["groups"]),
                    (f"held out ({f['held_out_rows']} rows entered to test the planner, never used to build it):",
                     f["held_out_groups"])]
        if f["groups"] and f["held_out_groups"]:  # the whole suite's medians only where both kinds exist
            sections.append(("the whole suite (built and held-out rows together):", f["all_groups"]))
        for header, groups in sections:
            if header and groups:
                lines.append("  " + header)
            pad = "    " if header else "  "
            for g, m in groups.items():
                if g == "fit":
                    lines.append(f"{pad}fit verdicts: {m['rows'] - m['wrong']} of {m['rows']} right")
                else:
                    lines.append(f"{pad}{g}: median |error| {m['median_abs_err']:.1%} over {m['rows']} rows "
                                 f"(worst {m['max_abs_err']:.1%})")
        lines.append("")
        t = self.compared
        w = max([len(i) for i in self.table.id] + [2]) + 1
        shown = {r.id: r.quantity + (f" ({r.memory_figure})" if r.memory_figure else "") for r in t.itertuples()}
        qw = max([len(q) for q in shown.values()] + [11]) + 1
        lines.append(f"{'id':<{w}}  {'system':<13} {'quantity':<{qw}} {'published':>10} {'predicted':>10} {'error':>9}")
        for r in t.itertuples():
            err = ("right" if r.error == 0 else "WRONG") if r.quantity == "fits" else f"{r.error:+.1%}"
            if r.quantity != "fits" and not r.planned_fits:
                err += " !"
            name = r.id + ("*" if r.assumed else "") + ("^" if r.held_out else "")
            lines.append(f"{name:<{w}}  {r.system:<13} {shown[r.id]:<{qw}} {_num(r.published):>10} "
                         f"{_num(r.predicted):>10} {err:>9}")
        lines.append("* the source leaves part of the setup unstated; the row's assumption is in published.csv "
                     "(assumed)")
        if t.held_out.any():
            lines.append("^ held out: entered to test the planner, never used to build it; its error when entered is in "
                         "published.csv (entered)")
        if (t.quantity != "fits").any() and not t[t.quantity != "fits"].planned_fits.all():
            lines.append("! the planner says this setup does not fit the device or host; the speed is what it "
                         "would be")
        rest = self.table[self.table.status != "ok"]
        if len(rest):
            lines += ["", "not compared:"]
            lines += [f"  {r.id}: {r.status}" for r in rest.itertuples()]
        return "\n".join(lines)


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def run_suite(rows: list[PublishedRow], say: Callable[[str], None] | None = None) -> SuiteResult:
    """Plan each row (once per distinct setup) and compare. A row whose setup the planner
    refuses is kept, with the planner's reason as its status."""
    plans: dict[tuple, tuple | HorizonError] = {}
    out = []
    for i, row in enumerate(rows):
        q = QUANTITIES[row.quantity]
        rec = dict(id=row.id, source=row.source, system=row.system, quantity=row.quantity, unit=q.unit,
                   published=row.value, predicted=float("nan"), error=float("nan"), planned_fits=None,
                   assumed=row.assumed, cite=row.cite, held_out=row.held_out, entered=row.entered,
                   memory_figure=row.memory_figure)
        if row.unreachable:
            out.append({**rec, "status": f"not modelled: {row.unreachable}"})
            continue
        key = (row.system, row.plan, tuple(sorted(row.model.items())))
        if key not in plans:
            if say:
                say(f"[{i + 1}/{len(rows)}] {row.id}: planning {row.system} {row.plan}")
            try:
                plans[key] = plan_row(row)
            except HorizonError as e:
                plans[key] = e
        got = plans[key]
        if isinstance(got, HorizonError):
            out.append({**rec, "status": f"the planner refused the setup: {got}"})
            continue
        try:
            pred = q.read(*got, row.memory_figure)
        except HorizonError as e:
            out.append({**rec, "status": f"not modelled: {e}"})
            continue
        out.append({**rec, "predicted": pred, "error": error(q, pred, row.value), "planned_fits": got[0].summary.fits,
                    "status": "ok"})
    return SuiteResult(pd.DataFrame(out, columns=COLUMNS))
