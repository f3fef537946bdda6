"""One dot per compared row: predicted over published as a speed or a size (1 + error, so
"too fast" and "too big" are right of 1 whatever the unit), on a log axis with the +-15% band;
rows grouped by quantity group, coloured by system, open where the planner says the setup does
not fit. Fit verdicts are in the row labels (right / WRONG), not dots."""
from pathlib import Path

from horizon_sim.published.quantity import GROUPS, QUANTITIES
from horizon_sim.published.suite import SuiteResult

_STYLE = {"horizon": ("o", "#4c72b0", "Horizon's design"), "zero3-offload": ("s", "#dd8452", "ZeRO-3 offload (peer)"),
          "zero2-offload": ("D", "#55a868", "ZeRO-2 offload (peer)")}


def plot_published(res: SuiteResult, path: Path) -> Path:
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    from horizon_sim.report.memory_plot import save_figure
    t = res.compared.copy()
    t["group"] = t.quantity.map(lambda q: QUANTITIES[q].group)
    t["order"] = t.group.map(GROUPS.index)
    t = t.sort_values(["order"], kind="stable").reset_index(drop=True)
    fig = Figure(figsize=(8.5, 0.32 * len(t) + 1.4), dpi=100, layout="constrained")
    ax = fig.subplots()
    lo, hi = 0.2, 5.0
    ax.axvspan(1 / 1.15, 1.15, color="grey", alpha=0.15, linewidth=0)
    ax.axvline(1.0, color="black", linewidth=0.8)
    labels, seen = [], set()
    for i, r in t.iterrows():
        y = len(t) - 1 - i
        name = r.id + ("^" if r.held_out else "")
        if r.quantity == "fits":
            labels.append(f"{name}: fits {'right' if r.error == 0 else 'WRONG'}")
            continue
        labels.append(f"{name} ({r.quantity})")
        ratio = min(max(1.0 + r.error, lo), hi)
        m, color, label = _STYLE.get(r.system, ("^", "#55a868", r.system))  # a new family: its name
        ax.plot([ratio], [y], m, color=color, markersize=6, markerfacecolor=color if r.planned_fits else "white",
                label=None if r.system in seen else label)
        if ratio != 1.0 + r.error:  # off the axis: drawn at its edge, with its value
            ax.annotate(f"{1.0 + r.error:.1f}x", (ratio, y), textcoords="offset points", fontsize=7,
                        xytext=(-6 if ratio == hi else 6, 5), ha="right" if ratio == hi else "left")
        seen.add(r.system)
    ax.set_yticks(range(len(t)), labels[::-1], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xticks([0.25, 0.5, 1, 2, 4], ["0.25x", "0.5x", "1x", "2x", "4x"])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("predicted / published (speeds: faster to the right), band +-15%\n"
                  "open marker: the planner says the setup does not fit; ^ held out (never used to build it)")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return save_figure(fig, path)
