"""The overlap plot: one row per lane (h2d, compute, d2h, cpu) with every op as a bar coloured
by kind, layer numbers on bars wide enough to hold them, and device memory below on the same
time axis. Gaps in the compute row are the time the GPU waits."""
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from horizon_sim.report.memory_plot import draw_memory, save_figure
from horizon_sim.schedule.op import EMBED, Lane, OpKind

KIND_COLOR = {  # one hue family per lane; order is the legend's order
    OpKind.LOAD_WEIGHTS: "#4c72b0", OpKind.LOAD_CKPT: "#8fb3e0", OpKind.LOAD_INPUT: "#2a3f6b",
    OpKind.FORWARD: "#55a868", OpKind.RECOMPUTE: "#b5dc9a", OpKind.BACKWARD: "#dd8452",
    OpKind.HEAD: "#8172b3", OpKind.HEAD_LOSS: "#b3a9d9",
    OpKind.SAVE_CKPT: "#17a2b8", OpKind.OFFLOAD_GRADS: "#c44e52", OpKind.OFFLOAD_INPUT_GRAD: "#e377c2",
    OpKind.OPTIMIZER: "#937860", OpKind.EMBED_FWD: "#9e9e9e", OpKind.EMBED_BWD: "#bcbd22",
    OpKind.GRAD_NORM: "#222222",
    OpKind.REDUCE_SCATTER: "#6a3d9a", OpKind.HOST_REDUCE: "#cab2d6", OpKind.NET_REDUCE_SCATTER: "#e31a1c",
    OpKind.NET_ALL_GATHER: "#ff7f00", OpKind.NORM_ALL_REDUCE: "#555555", OpKind.UPDATE_BARRIER: "#999999",
    OpKind.BACKWARD_SAVED: "#f0b27a", OpKind.HOOKS: "#bdbdbd", OpKind.HOST_PASS: "#969696", OpKind.RELOAD_GRADS: "#9e9ac8", OpKind.UPLOAD_PARAMS: "#3182bd", OpKind.DISK_READ: "#1b9e77", OpKind.DISK_WRITE: "#66c2a5",
    OpKind.ADAPTER_UPDATE: "#8c564b", OpKind.ADAPTER_ALL_REDUCE: "#c49c94", OpKind.ADAPTER_NET_ALL_REDUCE: "#e7969c", OpKind.OFFLOAD_ADAPTER_GRADS: "#ad494a",
    OpKind.ADAPTER_HOST_UPDATE: "#7b4173", OpKind.REF_FORWARD: "#8ebf8a",
}
LANES = [lane.value for lane in Lane]  # top to bottom
BAR_HEIGHT = 0.72
FONT_PT = 7
WIDTH_IN, DPI = 14.0, 110
_AXES_FRACTION = 0.76  # of the figure width (measured with the legends); known before layout


def _text_color(hex_color: str) -> str:
    r, g, b = to_rgb(hex_color)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def _bar_text(kind: str, layer: int, micro: int) -> str:
    if kind in (OpKind.GRAD_NORM.value, OpKind.NORM_ALL_REDUCE.value, OpKind.ADAPTER_UPDATE.value,
                OpKind.ADAPTER_ALL_REDUCE.value, OpKind.ADAPTER_NET_ALL_REDUCE.value, OpKind.ADAPTER_HOST_UPDATE.value):
        return "norm"
    unit = "E" if layer == EMBED else ("H" if kind in (OpKind.HEAD.value, OpKind.HEAD_LOSS.value) else str(layer))
    return f"{unit}.{micro}" if micro else unit


def default_title(result) -> str:
    s, meta, hw = result.summary, result.schedule.meta, result.hardware
    pol = meta.policy
    return (f"{meta.model.name} on {hw.device.name}: step {s.step_time_s:.3f} s, "
            f"MFU {s.mfu:.1%}, {s.tokens_per_s:,.0f} tokens/s\n"
            f"batch {pol.batch} x seq {pol.seq}, K={pol.act_ckpt_every}, "
            f"{pol.slots} slots, optimizer {pol.optimizer}; limit: {s.bottleneck}")


def draw_lanes(ax, result) -> None:
    """Bars of every op on `ax`, one row per lane."""
    tl, s = result.timeline, result.summary
    # the four lanes of one device always; the fabric and network rows when the step has them
    lanes = [lane for lane in LANES if lane in LANES[:4] or lane in set(tl.lane)]
    y = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}
    px_per_s = WIDTH_IN * DPI * _AXES_FRACTION / s.step_time_s
    for (lane, kind), g in tl.groupby(["lane", "kind"], sort=False):
        # a thin white edge separates back-to-back bars, but would wash out bars a few px wide
        edges = [0.4 if d * px_per_s > 4 else 0.0 for d in g.dur_s]
        ax.broken_barh(list(zip(g.start_s, g.dur_s)), (y[lane] - BAR_HEIGHT / 2, BAR_HEIGHT),
                       facecolors=KIND_COLOR[OpKind(kind)], edgecolor="white", linewidths=edges)
    # label a bar when its width in pixels holds the text
    char_px = FONT_PT * 0.62 * DPI / 72
    for r in tl.itertuples(index=False):
        text = _bar_text(r.kind, r.unit, r.micro)
        if r.dur_s * px_per_s >= len(text) * char_px + 4:
            ax.text(r.start_s + r.dur_s / 2, y[r.lane], text, ha="center", va="center",
                    fontsize=FONT_PT, color=_text_color(KIND_COLOR[OpKind(r.kind)]), clip_on=True)
    busy = s.lane_busy
    ax.set_yticks([y[l] for l in lanes],
                  [f"{l}\n{busy[l]:.0%} busy" if l in busy else l for l in lanes])
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_xlim(0, s.step_time_s)
    ax.grid(axis="x", alpha=0.3)
    present = [k for k in KIND_COLOR if k.value in set(tl.kind)]
    ax.legend(handles=[Patch(color=KIND_COLOR[k], label=k.value) for k in present],
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def plot_overlap(result, path=None, title: str | None = None) -> Figure:
    """Gantt of the step's lanes above device memory over time; saved to `path` when given.
    Returns the figure."""
    fig = Figure(figsize=(WIDTH_IN, 6.5), dpi=DPI, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.5])
    draw_lanes(top, result)
    top.set_title(title or default_title(result), fontsize=10)
    draw_memory(bottom, result)
    if path is not None:
        save_figure(fig, path)
    return fig
