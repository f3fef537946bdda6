"""Report section 5, the feasibility map: plan.sweep over model presets x RAM sizes on one GPU,
under the default policy and a lean one, drawn as one map with a panel per policy, with the
largest preset that fits at each RAM size (largest_fitting) as a table."""
import pandas as pd

from horizon_sim.plan.grid import parse_grid
from horizon_sim.plan.sweep import sweep, write_results
from horizon_sim.report.feasibility_map import feasibility_map
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import md_table, policy_text, size
from horizon_sim.report.out import Out, Section
from horizon_sim.specs.policy import Policy


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
            f"fit. Default policy: {policy_text(Policy())}. Lean policy: the default with {lean_desc} "
            f"(the smallest host footprint at fp32 moments). Presets whose learned positions are fewer than "
            f"the policy's {Policy().seq} tokens (GPT-2's 1024) are left out.\n\n{sent}\n\n"
            f"![feasibility map](feasibility_{cfg.map_gpu}.png)\n\n{table}\n\n"
            f"Files: [`feasibility_{cfg.map_gpu}_default.csv`](feasibility_{cfg.map_gpu}_default.csv), "
            f"[`feasibility_{cfg.map_gpu}_lean.csv`](feasibility_{cfg.map_gpu}_lean.csv), "
            f"[`feasibility.md`](feasibility.md).")
    return Section(f"Feasibility map: {cfg.map_gpu}", body,
                   {"cells": n_cells, "fit_default": fd, "fit_lean": fl, "rows": len(rows)})


def _name(v) -> str:
    return "nothing" if v is None else f"{v[0]} ({v[1] / 1e9:.1f}B)"
