"""The feasibility map of a sweep: model size (y) against host RAM (x), one panel per GPU and
link, each cell the best predicted tokens/s of the configurations that fit. Drawn here, with the
other plots; plan/sweep.py only computes the table it draws."""
import math
from pathlib import Path

import pandas as pd

from horizon_sim.units import fmt_bytes


def feasibility_map(df: pd.DataFrame, path) -> Path:
    """A PNG per grid: model size (y) against host RAM (x), one panel per GPU (and link), cells
    coloured by the best tokens/s of the configurations that fit; an x marks cells where none fits."""
    import matplotlib
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure

    models = df[["model", "params"]].drop_duplicates().sort_values(["params", "model"])
    rams = sorted(df.ram_bytes.unique())
    df = df.copy()
    # several data-parallel layouts: a panel each (RAM is per node, tokens/s the job's)
    layouts = df[["devices_per_node", "nodes"]].drop_duplicates() if "nodes" in df else None
    if layouts is not None and len(layouts) > 1:
        df["link"] = df.link + " / " + df.nodes.astype(str) + " x " + df.devices_per_node.astype(str) + " GPUs"
    panels = df[["gpu", "link"]].drop_duplicates().values.tolist()
    ok = df[df.fits.astype(bool)]
    best = ok.groupby(["gpu", "link", "model", "ram_bytes"]).tokens_per_s.max()
    vals = best.values
    if len(vals) and vals.min() > 0 and vals.max() / vals.min() > 20:
        norm = LogNorm(vmin=vals.min(), vmax=vals.max())
    else:
        norm = Normalize(vmin=vals.min() if len(vals) else 0, vmax=vals.max() if len(vals) else 1)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    ny, nx = len(models), len(rams)
    fig = Figure(figsize=(1.2 + max(3.0, 0.9 * nx) * len(panels), 1.6 + 0.45 * ny))
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)
    im = None
    for ax, (gpu, link) in zip(axes[0], panels):
        grid = [[best.get((gpu, link, m, r), float("nan")) for r in rams] for m in models.model]
        im = ax.imshow(grid, cmap=cmap, norm=norm, origin="lower", aspect="auto")
        for i in range(ny):
            for j in range(nx):
                v = grid[i][j]
                if math.isnan(v):
                    ax.text(j, i, "x", ha="center", va="center", color="#aa0000", fontsize=12)
                else:
                    light = norm(v) < 0.6  # dark cell: white text
                    ax.text(j, i, _short(v), ha="center", va="center", fontsize=8,
                            color="white" if light else "black")
        ax.set_xticks(range(nx), [fmt_bytes(r) for r in rams], rotation=45, ha="right")
        ax.set_xlabel("host RAM")
        ax.set_title(f"{gpu} / {link}", fontsize=10)
    axes[0][0].set_yticks(range(ny), [f"{m} ({_short(p)})" for m, p in models.values])
    axes[0][0].set_ylabel("model (parameters)")
    cb = fig.colorbar(im, ax=axes[0].tolist(), fraction=0.05, pad=0.02)
    cb.set_label("best tokens/s that fits (x: nothing fits)")
    fig.suptitle("feasibility: best predicted tokens/s per model and host RAM", fontsize=11,
                 y=1.0 + 0.25 / fig.get_figheight())
    from horizon_sim.report.memory_plot import save_figure
    return save_figure(fig, Path(path), dpi=120, bbox_inches="tight")


def _short(v: float) -> str:
    """3.9M, 120B, 1.9k, 712."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= size:
            return f"{v / size:.3g}{unit}"
    return f"{v:.3g}"
