"""Regenerate the planner part of reports/: figures, tables and reports/README.md, all from
the planner's own APIs (plan, advise, tune, min_ram, sweep, the Gantt and memory plots).

    python -m horizon_sim.report.build [--out reports] [--workers N] [--quick]

Sections (each a function below that writes its files and returns its README text):
  1. headline      dense-120b on an H200 with 1.5 TB of RAM: the default policy's verdict, the
                   nearest policy that fits (advise) and the fastest (tune), with a Gantt and a trace
  2. fit_table     7B/14B/32B on A100-80GB and H100-PCIe with 256 GiB..1 TiB: default vs tuned
  3. optimizer     the three optimizer overlap modes on one model, stacked Gantt panels
  4. checkpoints   checkpoints on the device vs on the host: device peak, step time, memory plot
  5. feasibility   presets x RAM sizes on an H100-PCIe (plan.sweep), default and lean policies

The build owns only the files it writes. It records them in reports/.planner-build-files and,
on the next run, deletes those it no longer writes; every other file in reports/ (e.g. the
output of `horizon validate`) is left alone. No wall-clock dates are written, so an unchanged
planner gives byte-identical tables and traces.
"""
import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from horizon_sim.plan import plan
from horizon_sim.plan.advice import nearest_fit, policy_flags
from horizon_sim.plan.min_ram import min_ram
from horizon_sim.plan.sweep import Runner, feasibility_map, parse_grid, sweep, write_results
from horizon_sim.plan.tune import tune
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.model_presets import PRESETS
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB, TiB, fmt_bytes, parse_size

MANIFEST = ".planner-build-files"
"""Lists, one per line, the files the previous build wrote (relative to the output folder)."""
DPI = 100
"""Resolution of the figures this module draws itself (the Gantt and the map use their own ~110-120)."""


# ---- what to build ---------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildConfig:
    """Every model, machine and policy the report covers. FULL is the committed report;
    QUICK is a small stand-in with the same structure, for tests."""

    headline_model: str = "dense-120b"
    headline_gpu: str = "h200"
    headline_ram: str = "1.5TB"
    headline_policy: Policy = Policy(batch=8, seq=4096)
    """The default policy at the paper's batch shape (8 x 4096, as `make demo`)."""
    table_models: tuple[str, ...] = ("llama-3.1-8b", "qwen2.5-14b", "qwen2.5-32b")
    table_gpus: tuple[str, ...] = ("a100-80gb", "h100-pcie")
    table_rams: tuple[str, ...] = ("256GiB", "512GiB", "1TiB")
    table_policy: Policy = Policy()
    """The default policy; tune() searches from it and keeps its numerics (clip, dtypes)."""
    modes_model: str = "llama-3.1-8b"
    modes_gpu: str = "h100-pcie"
    modes_ram: str = "512GiB"
    modes_policy: Policy = Policy(batch=8, seq=4096)
    """optimizer is set per mode; grad_clip becomes 0 for 'backward' (it cannot clip exactly)."""
    ckpt_models: tuple[str, ...] = ("llama-3.1-8b", "qwen2.5-32b")
    ckpt_gpu: str = "h100-pcie"
    ckpt_ram: str = "512GiB"
    ckpt_policy: Policy = Policy(batch=8, seq=4096)
    map_gpu: str = "h100-pcie"
    map_models: tuple[str, ...] = tuple(n for n in PRESETS if n != "tiny")
    map_rams: tuple[str, ...] = ("128GiB", "256GiB", "384GiB", "512GiB", "768GiB", "1TiB",
                                 "1.5TiB", "2TiB")
    map_lean: dict = field(default_factory=lambda: {"optimizer": "backward", "grad_clip": 0.0,
                                                    "working_copy": False})
    """The second map's policy: the default with the leanest host footprint at fp32 moments."""


FULL = BuildConfig()
QUICK = BuildConfig(
    headline_model="qwen2.5-0.5b", headline_gpu="h100-pcie", headline_ram="18GiB",
    headline_policy=Policy(batch=4, seq=1024),
    table_models=("tiny", "qwen2.5-0.5b"), table_gpus=("h100-pcie",), table_rams=("16GiB", "64GiB"),
    modes_model="tiny", modes_policy=Policy(batch=4, seq=512),
    ckpt_models=("tiny", "qwen2.5-0.5b"), ckpt_policy=Policy(batch=4, seq=1024),
    map_models=("tiny", "qwen2.5-0.5b", "llama-3.1-8b"), map_rams=("16GiB", "64GiB", "256GiB"),
)


# ---- output bookkeeping ----------------------------------------------------------------------
class Out:
    """The output folder; remembers every file written through it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.written: list[str] = []

    def path(self, name: str) -> Path:
        if name not in self.written:
            self.written.append(name)
        return self.root / name

    def text(self, name: str, content: str) -> Path:
        p = self.path(name)
        p.write_text(content)
        return p

    def previous(self) -> list[str]:
        m = self.root / MANIFEST
        return [ln.strip() for ln in m.read_text().splitlines() if ln.strip()] if m.is_file() else []

    def remove_stale(self) -> list[str]:
        """Delete what the previous build wrote and this one did not (call after every output
        is registered). Returns the names deleted."""
        stale = [n for n in self.previous() if n not in self.written and "/" not in n and n != MANIFEST]
        for n in stale:
            (self.root / n).unlink(missing_ok=True)
        return stale

    def write_manifest(self) -> None:
        (self.root / MANIFEST).write_text("".join(f"{n}\n" for n in sorted(self.written)))


def log(msg: str, t0: float | None = None) -> None:
    """One progress line on stderr."""
    tail = f" ({time.perf_counter() - t0:.1f} s)" if t0 is not None else ""
    print(f"[reports] {msg}{tail}", file=sys.stderr, flush=True)


@dataclass
class Section:
    title: str
    body: str
    data: dict = field(default_factory=dict)
    """Headline numbers, for the final summary line and tests."""


# ---- formatting helpers ----------------------------------------------------------------------
def md_table(rows: list[dict], cols: list[tuple]) -> str:
    """A GitHub markdown table. cols: (header, key, formatter, align 'l' or 'r')."""
    head = "| " + " | ".join(h for h, *_ in cols) + " |"
    rule = "|" + "|".join(("---:" if a == "r" else ":---") for *_, a in cols) + "|"
    body = ["| " + " | ".join(f(r[k]) for _, k, f, _ in cols) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def gib(n) -> str:
    return f"{n / GiB:,.1f}"


def tps(v) -> str:
    return "-" if v is None or v != v else f"{v:,.0f}"


def pct(v) -> str:
    return "-" if v is None or v != v else f"{v:.1%}"


def secs(v) -> str:
    """Seconds to 3 significant digits: '47.1 s', '0.822 s'."""
    return f"{v:.3g} s"


def size(n: int) -> str:
    """Whole sizes as sold: '256 GiB', '1.5 TiB'; otherwise fmt_bytes."""
    for unit, b in (("TiB", TiB), ("GiB", GiB)):
        if n >= b and (n * 4) % b == 0:
            return f"{n / b:g} {unit}"
    return fmt_bytes(n)


def ram_label(ram: str) -> str:
    """'1.5TB' -> '1.5 TB (1.36 TiB)'; '512GiB' -> '512 GiB'."""
    n = parse_size(ram)
    if ram.lower().endswith("ib"):
        return size(n)
    num = ram.rstrip("BbKkMmGgTt")
    return f"{num} {ram[len(num):]} ({fmt_bytes(n)})"


def flags_or_default(p: Policy, base: Policy) -> str:
    f = policy_flags(p, base)
    return f"`{f}`" if f else "(as default)"


def _policy_text(p: Policy) -> str:
    return (f"batch {p.batch} x seq {p.seq} ({p.micro_batches} micro-batch{'es' if p.micro_batches > 1 else ''}), "
            f"K={p.ckpt_every}, {p.slots} slots, checkpoints on {p.ckpt_on}, optimizer {p.optimizer}, "
            f"clip {p.grad_clip:g}, moments {p.states_dtype}, working copy {'on' if p.working_copy else 'off'}")


# ---- 1. headline ----------------------------------------------------------------------------
def build_headline(cfg: BuildConfig, out: Out, runner: Runner) -> Section:
    model = load_model(cfg.headline_model)
    hw = make_hardware(cfg.headline_gpu, cfg.headline_ram)
    base = cfg.headline_policy
    r0 = plan(model, hw, base)
    s0 = r0.summary
    nf = None if s0.fits else nearest_fit(model, hw, base, runner=runner)
    tr = tune(model, hw, seq=base.seq, base=replace(base, grad_clip=0.0), runner=runner)
    best = tr.best
    data = {"model": model.name, "params": model.total_params, "hardware": hw.name,
            "default": {"policy": base.to_dict(), "fits": s0.fits, "why": s0.why,
                        "tokens_per_s": s0.tokens_per_s, "step_time_s": s0.step_time_s, "mfu": s0.mfu,
                        "host_bytes": s0.host_bytes, "device_peak_bytes": s0.device_peak_bytes,
                        "host_breakdown_bytes": dict(r0.host.by_role)}}
    need0 = None
    if s0.device_peak_bytes <= hw.device_bytes_usable:
        need0 = min_ram(model, hw, base).ram_bytes
        data["default"]["min_ram_bytes"] = need0

    lines = [f"**Default policy** ({_policy_text(base)}): "
             f"**{'fits' if s0.fits else 'does not fit'}**: {s0.why}."]
    if not s0.fits and need0:
        lines[-1] += (f" It would need {need0 // GiB:,} GiB of RAM installed (`horizon min-ram`), "
                      f"{(need0 - parse_size(cfg.headline_ram)) / GiB:,.0f} GiB more than the "
                      f"{ram_label(cfg.headline_ram)} here.")
    lines += ["", "Its host footprint, by role:", "",
              md_table([{"role": k, "b": v} for k, v in r0.host.by_role.items() if v >= GiB / 100]
                       + [{"role": "**total**", "b": s0.host_bytes}],
                       [("role", "role", str, "l"), ("GiB", "b", gib, "r"),
                        ("bytes/param", "b", lambda b: f"{b / model.total_params:.2f}", "r")]),
              ]
    pick = None
    if nf is not None:
        o = nf.outcome
        lines += ["", f"**Nearest policy that fits** (`advise`: changes that leave the training as it is first, then the fewest changes; here {', '.join(nf.changes)}): "
                      f"{flags_or_default(nf.policy, base)} -> {o.tokens_per_s:,.0f} tokens/s, MFU {o.mfu:.1%}, "
                      f"host {fmt_bytes(o.host_bytes)}, device {fmt_bytes(o.device_peak_bytes)}."]
        data["nearest_fit"] = {"changes": list(nf.changes), "policy": nf.policy.to_dict(),
                               "tokens_per_s": o.tokens_per_s, "mfu": o.mfu, "host_bytes": o.host_bytes,
                               "device_peak_bytes": o.device_peak_bytes}
        pick = nf.policy
    if best is not None:
        b = tr.table.iloc[0]
        lines += ["", f"**Tuned policy** (`tune`: the fastest that fits of {tr.evaluated} configurations "
                      f"simulated, from the default with clipping off so the optimizer may run in backward; "
                      f"moments stay fp32): "
                      f"{flags_or_default(best, base)} -> {b.tokens_per_s:,.0f} tokens/s, step "
                      f"{secs(b.step_time_s)}, MFU {b.mfu:.1%}, host {fmt_bytes(b.host_bytes)}, "
                      f"device {fmt_bytes(b.device_peak_bytes)}, limited by {b.bottleneck}."]
        data["tuned"] = {"policy": best.to_dict(), "tokens_per_s": float(b.tokens_per_s),
                         "step_time_s": float(b.step_time_s), "mfu": float(b.mfu),
                         "host_bytes": int(b.host_bytes), "device_peak_bytes": int(b.device_peak_bytes),
                         "evaluated": tr.evaluated}
        pick = best
    elif nf is None:
        lines += ["", "Neither `advise` (3 changes) nor `tune` finds a policy that fits."]
    if pick is None and s0.fits:
        pick = base

    if pick is not None:
        from horizon_sim.report.gantt import plot_overlap
        from horizon_sim.report.trace import write_trace
        rp = plan(model, hw, pick)
        plot_overlap(rp, out.path("headline_overlap.png"))
        write_trace(rp, out.path("headline_trace.json"))
        sp = rp.summary
        busy = sp.lane_busy
        lines += ["", "![headline overlap](headline_overlap.png)", "",
                  f"The {'tuned' if pick is best else 'nearest-fit' if nf is not None and pick is nf.policy else 'default'} "
                  f"step: compute is busy "
                  f"{busy.get('compute', 0):.0%} of the {secs(sp.step_time_s)} step and waits "
                  f"{sp.exposed_copy_s:.2f} s on copies and {sp.exposed_optimizer_s:.2f} s on the CPU optimizer; "
                  f"device memory peaks at {fmt_bytes(sp.device_peak_bytes)} of "
                  f"{fmt_bytes(sp.device_usable_bytes)} usable. "
                  "Trace for [ui.perfetto.dev](https://ui.perfetto.dev): "
                  "[`headline_trace.json`](headline_trace.json)."]
        data["shown"] = {"policy": pick.to_dict(), "step_time_s": sp.step_time_s,
                         "exposed_copy_s": sp.exposed_copy_s, "exposed_optimizer_s": sp.exposed_optimizer_s}
    out.text("headline.json", json.dumps(data, indent=1, default=str) + "\n")
    lines += ["", "Numbers: [`headline.json`](headline.json)."]
    title = (f"1. Headline: {model.name} ({model.total_params / 1e9:.1f}B) on one {hw.device.name} "
             f"with {ram_label(cfg.headline_ram)} of RAM")
    return Section(title, "\n".join(lines), data)


# ---- 2. default vs tuned on 7B-32B -----------------------------------------------------------
FIT_COLS = [("model", "model", str, "l"), ("GPU", "gpu", str, "l"), ("RAM", "ram", str, "r"),
            ("policy", "policy", str, "l"), ("fits", "fits_text", str, "l"),
            ("tokens/s", "tokens_per_s", tps, "r"), ("MFU", "mfu", pct, "r"),
            ("bottleneck", "bottleneck", str, "l"), ("host GiB", "host_bytes", gib, "r"),
            ("device GiB", "device_peak_bytes", gib, "r"), ("tuned changes", "changes", str, "l")]


def fit_rows(cfg: BuildConfig, runner: Runner) -> list[dict]:
    """Two rows (default, tuned) per model x GPU x RAM size."""
    rows = []
    for name in cfg.table_models:
        model = load_model(name)
        for gpu in cfg.table_gpus:
            for ram in cfg.table_rams:
                hw = make_hardware(gpu, ram)
                base = cfg.table_policy
                d = runner.one(model, hw, base)
                tr = tune(model, hw, seq=base.seq, base=base, runner=runner)
                t = tr.table.iloc[0]  # the best that fits, else the nearest miss
                common = {"model": model.name, "params": model.total_params, "gpu": gpu, "ram": ram_label(ram),
                          "ram_bytes": parse_size(ram)}
                for kind, o_fits, why, vals, pol in (
                        ("default", d.fits(hw), d.why_not(hw),
                         (d.tokens_per_s, d.step_time_s, d.mfu, d.bottleneck, d.host_bytes, d.device_peak_bytes), base),
                        ("tuned", bool(t.fits), t.why_not,
                         (t.tokens_per_s, t.step_time_s, t.mfu, t.bottleneck, t.host_bytes, t.device_peak_bytes),
                         t.policy)):
                    tp, st, mfu, bn, hb, db = vals
                    rows.append({**common, "policy": kind, "fits": bool(o_fits),
                                 "fits_text": "yes" if o_fits else f"no: {why}",
                                 "tokens_per_s": float(tp) if o_fits else math.nan,
                                 "step_time_s": float(st) if o_fits else math.nan,
                                 "mfu": float(mfu) if o_fits else math.nan,
                                 "bottleneck": bn if o_fits else "-",
                                 "host_bytes": int(hb), "device_peak_bytes": int(db),
                                 "changes": "" if kind == "default" else (policy_flags(pol, base) or "none"),
                                 "batch": pol.batch, "micro_batches": pol.micro_batches, "ckpt_every": pol.ckpt_every,
                                 "slots": pol.slots, "ckpt_on": pol.ckpt_on, "optimizer": pol.optimizer,
                                 "working_copy": pol.working_copy, "grad_clip": pol.grad_clip})
    return rows


def build_fit_table(cfg: BuildConfig, out: Out, runner: Runner) -> Section:
    rows = fit_rows(cfg, runner)
    df = pd.DataFrame(rows)
    csv_cols = ["model", "params", "gpu", "ram", "ram_bytes", "policy", "fits", "tokens_per_s", "step_time_s",
                "mfu", "bottleneck", "host_bytes", "device_peak_bytes", "batch", "micro_batches", "ckpt_every",
                "slots", "ckpt_on", "optimizer", "working_copy", "grad_clip", "changes"]
    df[csv_cols].to_csv(out.path("fit_table.csv"), index=False, float_format="%.6g")
    shown = [{**r, "changes": f"`{r['changes']}`" if r["changes"] not in ("", "none") else r["changes"]}
             for r in rows]
    table = md_table(shown, FIT_COLS)
    out.text("fit_table.md", table + "\n")
    # the sentence, from the rows
    dflt = {(r["model"], r["gpu"], r["ram"]): r for r in rows if r["policy"] == "default"}
    tund = {(r["model"], r["gpu"], r["ram"]): r for r in rows if r["policy"] == "tuned"}
    n = len(dflt)
    n_d, n_t = sum(r["fits"] for r in dflt.values()), sum(r["fits"] for r in tund.values())
    ratios = {k: tund[k]["tokens_per_s"] / dflt[k]["tokens_per_s"] for k in dflt
              if dflt[k]["fits"] and tund[k]["fits"]}
    sent = f"Of {n} model x GPU x RAM configurations, {n_d} fit under the default policy and {n_t} under the tuned one"
    if ratios:
        kmax = max(ratios, key=ratios.get)
        sent += (f"; where both fit, tuning raises tokens/s by a median {statistics.median(ratios.values()):.1f}x "
                 f"(up to {ratios[kmax]:.1f}x for {kmax[0]} on {kmax[1]} with {kmax[2]}), mostly through a bigger "
                 f"batch ({statistics.median(tund[k]['batch'] for k in ratios):.0f} sequences, median, vs "
                 f"{cfg.table_policy.batch})")
    never = [k for k in dflt if not tund[k]["fits"]]
    if never:
        sent += ("; " + ", ".join(f"{m} on {g} with {r}" for m, g, r in never)
                 + " fit" + ("s" if len(never) == 1 else "") + " under no policy tune tries at fp32 moments and clip "
                 f"{cfg.table_policy.grad_clip:g} (see `fits` for what is short)")
    sent += "."
    body = (f"Default policy: {_policy_text(cfg.table_policy)}. Tuned: `tune` from it (same precision and "
            f"clipping), batch capped at 64 sequences. Empty tokens/s: does not fit (the column says what is "
            f"short; host and device GiB are what the policy needs).\n\n{sent}\n\n{table}\n\n"
            "Files: [`fit_table.csv`](fit_table.csv), [`fit_table.md`](fit_table.md).")
    title = (f"2. {' / '.join(cfg.table_models)} on {' and '.join(cfg.table_gpus)}: default vs tuned policy")
    return Section(title, body, {"configs": n, "fit_default": n_d, "fit_tuned": n_t,
                                 "median_speedup": statistics.median(ratios.values()) if ratios else None,
                                 "rows": len(rows)})


# ---- 3. optimizer overlap modes --------------------------------------------------------------
MODES = ("after", "backward", "pipelined")


def plot_modes(results: dict, path: Path) -> Path:
    """Three Gantt panels (one per optimizer mode) on one time axis."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from horizon_sim.report.gantt import KIND_COLOR, draw_lanes
    from horizon_sim.report.memory_plot import save_figure

    fig = Figure(figsize=(14, 2.5 * len(results) + 0.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(results), 1, sharex=True, squeeze=False)[:, 0]
    t_max = max(r.summary.step_time_s for r in results.values())
    kinds = set()
    for ax, (mode, r) in zip(axes, results.items()):
        draw_lanes(ax, r)
        ax.get_legend().remove()
        kinds |= set(r.timeline.kind)
        s, pol = r.summary, r.schedule.meta.policy
        ax.set_title(f"optimizer {mode} (clip {pol['grad_clip']:g}): step {s.step_time_s:.2f} s, "
                     f"compute waits {s.exposed_optimizer_s:.2f} s on the optimizer, "
                     f"{s.tokens_per_s:,.0f} tokens/s", fontsize=10, loc="left")
    axes[0].set_xlim(0, t_max)
    axes[-1].set_xlabel("time (s)")
    present = [k for k in KIND_COLOR if k.value in kinds]
    axes[0].legend(handles=[Patch(color=KIND_COLOR[k], label=k.value) for k in present],
                   loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return save_figure(fig, path)


def build_optimizer_modes(cfg: BuildConfig, out: Out) -> Section:
    model = load_model(cfg.modes_model)
    hw = make_hardware(cfg.modes_gpu, cfg.modes_ram)
    res = {}
    for mode in MODES:
        p = replace(cfg.modes_policy, optimizer=mode,
                    grad_clip=0.0 if mode == "backward" else cfg.modes_policy.grad_clip)
        res[mode] = plan(model, hw, p)
    plot_modes(res, out.path("optimizer_modes.png"))
    rows = [{"mode": m, "grad_clip": r.schedule.meta.policy["grad_clip"], "step_time_s": r.summary.step_time_s,
             "tokens_per_s": r.summary.tokens_per_s, "mfu": r.summary.mfu,
             "exposed_optimizer_s": r.summary.exposed_optimizer_s, "cpu_busy": r.summary.lane_busy.get("cpu", 0.0),
             "compute_busy": r.summary.lane_busy.get("compute", 0.0), "bottleneck": r.summary.bottleneck}
            for m, r in res.items()]
    pd.DataFrame(rows).to_csv(out.path("optimizer_modes.csv"), index=False, float_format="%.6g")
    table = md_table(rows, [("optimizer", "mode", str, "l"), ("clip", "grad_clip", lambda v: f"{v:g}", "r"),
                            ("step s", "step_time_s", lambda v: f"{v:.3f}", "r"),
                            ("exposed optimizer s", "exposed_optimizer_s", lambda v: f"{v:.3f}", "r"),
                            ("tokens/s", "tokens_per_s", tps, "r"), ("MFU", "mfu", pct, "r"),
                            ("compute busy", "compute_busy", pct, "r"), ("cpu busy", "cpu_busy", pct, "r"),
                            ("bottleneck", "bottleneck", str, "l")])
    out.text("optimizer_modes.md", table + "\n")
    a, b, pp = (res[m].summary for m in MODES)
    sent = (f"Pipelined hides {secs(a.exposed_optimizer_s - pp.exposed_optimizer_s)} of the "
            f"{secs(a.exposed_optimizer_s)} of optimizer time that `after` leaves exposed and shortens the step "
            f"from {secs(a.step_time_s)} to {secs(pp.step_time_s)} ({1 - pp.step_time_s / a.step_time_s:.0%} "
            f"shorter) with exact clipping; backward hides {secs(a.exposed_optimizer_s - b.exposed_optimizer_s)} "
            f"(step {secs(b.step_time_s)}, {1 - b.step_time_s / a.step_time_s:.0%} shorter) but cannot clip.")
    pol = cfg.modes_policy
    body = (f"{model.name} on {hw.device.name} + {hw.link.name}, {ram_label(cfg.modes_ram)} RAM, batch {pol.batch} x "
            f"{pol.seq}, otherwise the default policy; clip {pol.grad_clip:g} for after and pipelined, 0 for "
            f"backward. Panels share the time axis; a gap in the compute row is time the GPU waits.\n\n"
            f"{sent}\n\n![optimizer modes](optimizer_modes.png)\n\n{table}\n\n"
            "Files: [`optimizer_modes.csv`](optimizer_modes.csv), [`optimizer_modes.md`](optimizer_modes.md).")
    return Section("3. Optimizer overlap: after, backward, pipelined", body,
                   {m: r for m, r in zip(MODES, rows)})


# ---- 4. checkpoints on device vs host --------------------------------------------------------
PLACE_COLOR = {"device": "#c44e52", "host": "#4c72b0"}


def plot_ckpt_memory(results: dict, path: Path) -> Path:
    """Device memory over one step, one panel per model, both checkpoint placements overlaid."""
    from matplotlib.figure import Figure

    from horizon_sim.report.memory_plot import LIMIT_COLOR, save_figure

    models = list(results)
    fig = Figure(figsize=(11, 2.6 * len(models) + 0.4), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    for ax, m in zip(axes, models):
        peak = t_max = 0.0
        for place, r in results[m].items():
            s = r.summary
            tr = r.device_trace.drop_duplicates("time_s", keep="last")
            t = list(tr.time_s) + [s.step_time_s]
            g = [b / GiB for b in tr.bytes] + [tr.bytes.iloc[-1] / GiB]
            ax.step(t, g, where="post", color=PLACE_COLOR[place], linewidth=1.3,
                    label=f"checkpoints on {place}: peak {fmt_bytes(s.device_peak_bytes)}, "
                          f"step {s.step_time_s:.2f} s")
            ax.fill_between(t, g, step="post", color=PLACE_COLOR[place], alpha=0.12, linewidth=0)
            peak, t_max = max(peak, s.device_peak_bytes / GiB), max(t_max, s.step_time_s)
            limit = s.device_usable_bytes / GiB
        if limit <= 3 * peak:
            ax.axhline(limit, color=LIMIT_COLOR, linestyle="--", linewidth=1.0,
                       label=f"usable limit {limit:.1f} GiB")
            ax.set_ylim(0, max(limit, peak) * 1.12)
        else:
            ax.set_ylim(0, peak * 1.25)
            ax.plot([], [], " ", label=f"usable limit {limit:.1f} GiB (off scale)")
        ax.set_xlim(0, t_max)
        ax.set_ylabel("device GiB")
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(f"{m}: device memory over one step", fontsize=10, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    axes[-1].set_xlabel("time (s)")
    return save_figure(fig, path)


def build_checkpoints(cfg: BuildConfig, out: Out) -> Section:
    hw = make_hardware(cfg.ckpt_gpu, cfg.ckpt_ram)
    results, rows = {}, []
    for name in cfg.ckpt_models:
        model = load_model(name)
        results[model.name] = {}
        for place in ("device", "host"):
            r = plan(model, hw, replace(cfg.ckpt_policy, ckpt_on=place))
            results[model.name][place] = r
            s = r.summary
            rows.append({"model": model.name, "ckpt_on": place, "fits": s.fits,
                         "device_peak_bytes": s.device_peak_bytes, "step_time_s": s.step_time_s,
                         "tokens_per_s": s.tokens_per_s, "host_bytes": s.host_bytes,
                         "h2d_busy": s.lane_busy.get("h2d", 0.0), "d2h_busy": s.lane_busy.get("d2h", 0.0),
                         "bottleneck": s.bottleneck})
    plot_ckpt_memory(results, out.path("ckpt_memory.png"))
    pd.DataFrame(rows).to_csv(out.path("ckpt_placement.csv"), index=False, float_format="%.6g")
    table = md_table(rows, [("model", "model", str, "l"), ("checkpoints on", "ckpt_on", str, "l"),
                            ("fits", "fits", lambda f: "yes" if f else "no", "l"),
                            ("device peak GiB", "device_peak_bytes", gib, "r"),
                            ("step s", "step_time_s", lambda v: f"{v:.3f}", "r"),
                            ("tokens/s", "tokens_per_s", tps, "r"), ("host GiB", "host_bytes", gib, "r"),
                            ("h2d busy", "h2d_busy", pct, "r"), ("d2h busy", "d2h_busy", pct, "r"),
                            ("bottleneck", "bottleneck", str, "l")])
    out.text("ckpt_placement.md", table + "\n")
    parts = []
    for m, rs in results.items():
        d, h = rs["device"].summary, rs["host"].summary
        dt = d.step_time_s / h.step_time_s - 1
        txt = (f"{m} peaks at {fmt_bytes(d.device_peak_bytes)} of device memory with checkpoints on the device vs "
               f"{fmt_bytes(h.device_peak_bytes)} on the host; the device placement "
               + (f"shortens the step by {-dt:.1%}" if dt < -0.0005 else
                  f"lengthens the step by {dt:.1%}" if dt > 0.0005 else "leaves the step time unchanged")
               + f" ({secs(d.step_time_s)} vs {secs(h.step_time_s)}, bottleneck {d.bottleneck}) and "
               f"{'saves' if d.host_bytes <= h.host_bytes else 'adds'} {fmt_bytes(abs(h.host_bytes - d.host_bytes))} "
               f"of host RAM")
        if d.fits != h.fits:
            txt += (f", so only checkpoints on the {'device' if d.fits else 'host'} fit in "
                    f"{ram_label(cfg.ckpt_ram)}")
        parts.append(txt)
    pol = cfg.ckpt_policy
    body = (f"{hw.device.name} + {hw.link.name}, {ram_label(cfg.ckpt_ram)} RAM, batch {pol.batch} x {pol.seq}, "
            f"K={pol.ckpt_every}, otherwise the default policy. On the host, device memory stays independent of "
            f"depth; on the device, boundary activations accumulate through forward and are freed in backward.\n\n"
            + "; ".join(parts) + ".\n\n![checkpoint memory](ckpt_memory.png)\n\n" + table
            + "\n\nFiles: [`ckpt_placement.csv`](ckpt_placement.csv), [`ckpt_placement.md`](ckpt_placement.md).")
    return Section("4. Checkpoints on the device vs on the host", body, {"rows": rows})


# ---- 5. feasibility map ----------------------------------------------------------------------
def largest_fitting(df: pd.DataFrame) -> dict:
    """RAM bytes -> (model, params, tokens/s) of the largest model that fits (None if none)."""
    out = {}
    for ram, g in df.groupby("ram_bytes"):
        ok = g[g.fits.astype(bool)]
        if len(ok):
            best = ok.sort_values(["params", "tokens_per_s"], ascending=False).iloc[0]
            out[int(ram)] = (best.model, int(best.params), float(best.tokens_per_s))
        else:
            out[int(ram)] = None
    return out


def build_feasibility(cfg: BuildConfig, out: Out, workers: int | None) -> Section:
    grids = {"default": {}, "lean": cfg.map_lean}
    frames = {}
    for tag, pol in grids.items():
        grid = parse_grid({"models": list(cfg.map_models), "gpus": [cfg.map_gpu], "ram": list(cfg.map_rams),
                           "policy": dict(pol)}, where=f"feasibility {tag}")
        frames[tag] = df = sweep(grid, workers=workers)
        write_results(df, out.path(f"feasibility_{cfg.map_gpu}_{tag}.csv"))
    # one map, a panel per policy on one colour scale: feasibility_map makes a panel per (gpu, link),
    # so the policy goes into the link label of a copy of the rows (the CSVs keep the real link)
    both = pd.concat([df.assign(link=df.link + f", {tag} policy") for tag, df in frames.items()], ignore_index=True)
    png = f"feasibility_{cfg.map_gpu}.png"
    feasibility_map(both, out.path(png))
    rams = sorted(frames["default"].ram_bytes.unique())
    big = {tag: largest_fitting(df) for tag, df in frames.items()}
    rows = []
    for ram in rams:
        row = {"ram": size(int(ram))}
        for tag in grids:
            v = big[tag][int(ram)]
            row[tag] = "nothing" if v is None else f"{v[0]} ({v[1] / 1e9:.1f}B, {v[2]:,.0f} tokens/s)"
        rows.append(row)
    table = md_table(rows, [("host RAM", "ram", str, "r"), ("largest preset, default policy", "default", str, "l"),
                            ("largest preset, lean policy", "lean", str, "l")])
    out.text("feasibility.md", table + "\n")
    d0, l0 = frames["default"], frames["lean"]
    n_cells = len(d0)
    fd, fl = int(d0.fits.sum()), int(l0.fits.sum())
    lean_desc = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in cfg.map_lean.items())
    top = int(max(rams))
    # the smallest RAM at which each policy first trains a model the other needs more RAM for
    gained = []
    for m, g in l0.sort_values("params", kind="stable").groupby("model", sort=False):
        fl_r = g[g.fits.astype(bool)].ram_bytes.min()
        dg = d0[d0.model == m]
        fd_r = dg[dg.fits.astype(bool)].ram_bytes.min()
        if fl_r == fl_r and (fd_r != fd_r or fl_r < fd_r):
            gained.append(f"{m} from {size(int(fl_r))}" + (f" (default: {size(int(fd_r))})" if fd_r == fd_r
                                                              else " (default: not up to " + size(top) + ")"))
    sent = (f"Of {n_cells} preset x RAM cells on {cfg.map_gpu}, {fd} fit under the default policy and {fl} under "
            f"the lean one; with {size(top)} the largest preset that trains is {_name(big['default'][top])} "
            f"(default) and {_name(big['lean'][top])} (lean)")
    sent += ("; the lean policy trains " + ", ".join(gained) if gained else "") + "."
    body = (f"`horizon_sim.plan.sweep` over {len(cfg.map_models)} model presets x {len(cfg.map_rams)} RAM sizes on "
            f"{cfg.map_gpu} (its default link, the default host). Cells: the predicted tokens/s, x where it does not "
            f"fit. Default policy: {_policy_text(Policy())}. Lean policy: the default with {lean_desc} "
            f"(the smallest host footprint at fp32 moments).\n\n{sent}\n\n"
            f"![feasibility map](feasibility_{cfg.map_gpu}.png)\n\n{table}\n\n"
            f"Files: [`feasibility_{cfg.map_gpu}_default.csv`](feasibility_{cfg.map_gpu}_default.csv), "
            f"[`feasibility_{cfg.map_gpu}_lean.csv`](feasibility_{cfg.map_gpu}_lean.csv), "
            f"[`feasibility.md`](feasibility.md).")
    return Section(f"5. Feasibility map: {cfg.map_gpu}", body,
                   {"cells": n_cells, "fit_default": fd, "fit_lean": fl, "rows": len(rows)})


def _name(v) -> str:
    return "nothing" if v is None else f"{v[0]} ({v[1] / 1e9:.1f}B)"


# ---- README ----------------------------------------------------------------------------------
ESTIMATED = {
    "device": ("matmul_efficiency", "reserved_GiB", "launch_overhead_us"),
    "host": ("dram_GBps", "adam_Gparams_per_s", "os_reserved_GiB", "runtime_overhead_GiB"),
}
"""HardwareSpec fields whose preset values are estimates (see the comments in
specs/hardware.py and specs/hardware_presets.py): not measured on the hardware named."""


def estimates_section(cfg: BuildConfig) -> Section:
    gpus = dict.fromkeys([cfg.headline_gpu, *cfg.table_gpus, cfg.modes_gpu, cfg.ckpt_gpu, cfg.map_gpu])
    hws = [make_hardware(g, "512GiB") for g in gpus]
    groups: dict[str, list[str]] = {}
    for h in hws:
        vals = ", ".join(f"{f}={getattr(h.device, f):g}" for f in ESTIMATED["device"])
        groups.setdefault(vals, []).append(h.device.name)
    dev = "; ".join(f"{', '.join(names)}: {vals}" for vals, names in groups.items())
    host = hws[0].host
    links = dict.fromkeys(h.link.name for h in hws)
    body = (
        "Every number in this folder is a **prediction** of the planner (`horizon_sim`), made with "
        "hardware presets; none is measured here. Device peaks and memory sizes come from datasheets and "
        f"`nvidia-smi`, and the link rates ({', '.join(links)}) from published `nvbandwidth` runs where the "
        "preset cites one (some d2h and pageable rates are estimates). The presets mark these inputs as "
        "**estimates** (see `horizon_sim/specs/hardware.py` and `hardware_presets.py`) until `horizon calibrate` "
        "measures them:\n\n"
        f"- host `{host.name}`: " + ", ".join(f"{f}={getattr(host, f):g}" for f in ESTIMATED["host"]) + ";\n"
        f"- per device: {dev}.\n\n"
        "So every step time, tokens/s, MFU, bottleneck and Gantt chart below is an estimate (it rests on the "
        "DRAM bandwidth, the CPU AdamW rate and the matmul efficiency). The fit verdicts and the host and device "
        "GiB rest only on byte counts of the model and policy, plus the estimated reserves above "
        "(device `reserved_GiB`, host `os_reserved_GiB` and `runtime_overhead_GiB`).")
    return Section("What is estimated", body)


def validate_section(out: Out) -> Section:
    others = sorted(p.name for p in out.root.iterdir()
                    if p.name not in out.written and p.name not in (MANIFEST, "README.md")
                    and not p.name.startswith("."))
    body = ("Produced by `horizon calibrate` then `horizon validate` (both run by `make demo`): the executor "
            "(`horizon_exec`) runs six small configurations on this machine's backend, the planner simulates "
            "the same schedules on the calibrated hardware file, and the errors are tabulated with a Gantt "
            "overlay per configuration. Those files are measured, unlike the rest of this folder; this build "
            "leaves them alone.")
    table = out.root / "validation.md"
    if table.is_file():  # quote its headline, so the index says how close the planner came
        headline = next((ln for ln in table.read_text().splitlines() if ln.startswith("**Median")), "")
        if headline:
            body += f"\n\nFrom [`validation.md`](validation.md): {headline}"
    else:
        body += "\n\nNo `validation.md` here yet: run `make demo` or `horizon validate --out " \
                f"{out.root}`."
    if others:
        body += "\n\nFiles here from other commands:\n\n" + "\n".join(f"- [`{n}`]({n})" for n in others)
    return Section("Predicted vs measured", body)


def write_readme(out: Out, sections: list[Section], cfg: BuildConfig) -> Path:
    quick = cfg is QUICK
    head = ["# Horizon reports", "",
            "Generated by `make reports`, i.e. `python -m horizon_sim.report.build --out reports`"
            + (" (**--quick**: a reduced configuration for tests)" if quick else "")
            + ", from the planner's own APIs (`plan`, `advise.nearest_fit`, `tune`, `min_ram`, `sweep`, the Gantt and memory "
              "plots); nothing here is typed by hand. Do not edit: rerun the command. "
              "Open the `.json` trace in [ui.perfetto.dev](https://ui.perfetto.dev).", "",
            "Contents:", ""]
    head += [f"- [{s.title}](#{_anchor(s.title)})" for s in sections]
    text = "\n".join(head) + "\n"
    for s in sections:
        text += f"\n## {s.title}\n\n{s.body.rstrip()}\n"
    return out.text("README.md", text)


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


# ---- driver ----------------------------------------------------------------------------------
def build(out_dir="reports", *, quick: bool = False, workers: int | None = None,
          config: BuildConfig | None = None) -> dict:
    """Regenerate every planner report into `out_dir`. Returns {section key: Section}, plus
    'files' (what was written) and 'elapsed_s'."""
    cfg = config or (QUICK if quick else FULL)
    out = Out(Path(out_dir))
    t_all = time.perf_counter()
    sections = {}
    log(f"building planner reports into {out.root}/" + (" (quick)" if quick else ""))
    with Runner(workers) as runner:
        t = time.perf_counter()
        sections["headline"] = build_headline(cfg, out, runner)
        log(f"1/5 headline: {cfg.headline_model} on {cfg.headline_gpu}", t)
        t = time.perf_counter()
        sections["fit_table"] = build_fit_table(cfg, out, runner)
        log(f"2/5 default vs tuned: {' x '.join(', '.join(v) for v in (cfg.table_models, cfg.table_gpus, cfg.table_rams))}", t)
    t = time.perf_counter()
    sections["optimizer"] = build_optimizer_modes(cfg, out)
    log(f"3/5 optimizer modes: {cfg.modes_model}", t)
    t = time.perf_counter()
    sections["checkpoints"] = build_checkpoints(cfg, out)
    log(f"4/5 checkpoint placement: {', '.join(cfg.ckpt_models)}", t)
    t = time.perf_counter()
    sections["feasibility"] = build_feasibility(cfg, out, workers)
    log(f"5/5 feasibility map: {len(cfg.map_models)} presets x {len(cfg.map_rams)} RAM sizes on {cfg.map_gpu}", t)
    ordered = [sections[k] for k in ("headline", "fit_table", "optimizer", "checkpoints", "feasibility")]
    out.path("README.md")  # registered first, so the stale sweep and the file list know it is ours
    stale = out.remove_stale()
    write_readme(out, [estimates_section(cfg), *ordered, validate_section(out)], cfg)
    out.write_manifest()
    if stale:
        log(f"removed {len(stale)} file(s) an earlier build wrote: {', '.join(stale)}")
    size = sum((out.root / n).stat().st_size for n in out.written)
    log(f"wrote {len(out.written)} files, {size / 2**20:.2f} MiB, in {time.perf_counter() - t_all:.1f} s")
    return {**sections, "files": list(out.written), "elapsed_s": time.perf_counter() - t_all}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m horizon_sim.report.build",
        description="Regenerate the planner part of reports/ from scratch with the planner's own APIs: the "
                    "headline (dense-120b on one H200 with 1.5 TB RAM: the default policy's verdict, the "
                    "policy advise/tune finds, its Gantt plot and Perfetto trace), a default-vs-tuned table "
                    "for 8B/14B/32B models on A100-80GB and H100-PCIe, the three optimizer overlap modes, "
                    "checkpoints on device vs host, and feasibility maps for H100-PCIe; then reports/README.md "
                    "showing each. Only files this build wrote before are replaced or removed; other files "
                    "in the folder (e.g. from `horizon validate`) are kept. Progress goes to stderr.",
        epilog="example:  python -m horizon_sim.report.build --out reports   (what `make reports` runs)")
    p.add_argument("--out", default="reports", metavar="DIR", help="output folder (default: reports)")
    p.add_argument("--workers", type=int, default=None,
                   help="simulation processes for tune and sweep (default: all cores)")
    p.add_argument("--quick", action="store_true",
                   help="a reduced configuration (small models, few RAM sizes) for tests; seconds, not minutes")
    a = p.parse_args(argv)
    if a.workers is not None and a.workers < 1:
        p.error(f"--workers {a.workers} must be >= 1")
    res = build(a.out, quick=a.quick, workers=a.workers)
    h = res["headline"].data
    d, tb = h["default"], h.get("tuned")
    print(f"{h['model']} on {h['hardware']}: default policy {'fits' if d['fits'] else 'does not fit'}"
          + (f"; tuned policy {tb['tokens_per_s']:,.0f} tokens/s, MFU {tb['mfu']:.1%}" if tb else ""))
    print(f"wrote {len(res['files'])} files into {a.out}/ in {res['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
