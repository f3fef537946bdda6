"""Predicted vs measured Gantt overlay: for each lane, the simulator's bars (upper row, lighter)
above the executor's (lower row), same colour per op kind; a thin line joins the start of
each compute op in the prediction to the start of the same op (same op id) in the
measurement, so drift shows as leaning lines."""
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from horizon_sim.report.gantt import KIND_COLOR, LANES
from horizon_sim.report.memory_plot import save_figure
from horizon_sim.schedule.op import OpKind

BAR = 0.38
PRED_ALPHA = 0.55


def plot_overlay(predicted, measured, path=None, title: str = "") -> Figure:
    """predicted, measured: timelines (horizon_sim.sim.timeline columns) of the same schedule;
    times in seconds from the step's start. Saved to `path` when given."""
    fig = Figure(figsize=(14.0, 5.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    lanes = [l for l in LANES if l in set(predicted.lane) | set(measured.lane)]
    rows = {}
    ticks, labels = [], []
    for i, lane in enumerate(lanes):
        base = 2.4 * (len(lanes) - 1 - i)
        rows[(lane, "pred")], rows[(lane, "meas")] = base + 1.0, base + 0.5
        ticks += [base + 1.0, base + 0.5]
        labels += [f"{lane} predicted", f"{lane} measured"]
    for which, tl, alpha in (("pred", predicted, PRED_ALPHA), ("meas", measured, 1.0)):
        for (lane, kind), g in tl.groupby(["lane", "kind"], sort=False):
            y = rows[(lane, which)]
            ax.broken_barh(list(zip(g.start_s * 1e3, g.dur_s * 1e3)), (y - BAR / 2, BAR),
                           facecolors=KIND_COLOR[OpKind(kind)], alpha=alpha, edgecolor="white",
                           linewidths=0.3)
    # join each compute op's predicted and measured start
    p = predicted[predicted.lane == "compute"].set_index("op_id")
    m = measured[measured.lane == "compute"].set_index("op_id")
    for op_id in p.index.intersection(m.index):
        ax.plot([p.at[op_id, "start_s"] * 1e3, m.at[op_id, "start_s"] * 1e3],
                [rows[("compute", "pred")] - BAR / 2, rows[("compute", "meas")] + BAR / 2],
                color="#777777", linewidth=0.5, alpha=0.7)
    end = max(predicted.end_s.max(), measured.end_s.max()) * 1e3
    ends = []
    for which, tl, ls in (("predicted", predicted, "--"), ("measured", measured, "-")):
        t = tl.end_s.max() * 1e3
        ends.append(ax.axvline(t, color="#333333", linestyle=ls, linewidth=0.9,
                               label=f"{which} end ({t:.0f} ms)"))
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlim(0, end * 1.02)
    ax.set_ylim(-0.2, ticks[0] + 0.9)
    ax.set_xlabel("time from step start (ms)")
    ax.grid(axis="x", alpha=0.3)
    present = [k for k in KIND_COLOR if k.value in set(predicted.kind) | set(measured.kind)]
    ax.legend(handles=[Patch(color=KIND_COLOR[k], label=k.value) for k in present] + ends,
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    if path is not None:
        save_figure(fig, path)
    return fig
