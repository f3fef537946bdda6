"""Device memory over one step: bytes in use (GiB) as a step function, the peak, and the
usable limit as a dashed line. draw_memory() fills an axes (the Gantt's lower panel);
plot_memory() makes a standalone figure."""
import io
from pathlib import Path

from matplotlib.figure import Figure

from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import refuse_non_regular, write_atomic
from horizon_sim.units import GiB, fmt_bytes

MEMORY_COLOR = "#4c72b0"
LIMIT_COLOR = "#c44e52"
OFF_SCALE = 3.0  # show the limit to scale when it is within this factor of the peak


def draw_memory(ax, result) -> None:
    """Plot device memory (GiB) against time (s) on `ax`."""
    s = result.summary
    # several changes at one instant (a release, then an allocation) show as the last value
    tr = result.device_trace.drop_duplicates("time_s", keep="last")
    t = list(tr.time_s) + [s.step_time_s]
    gib = [b / GiB for b in tr.bytes] + [tr.bytes.iloc[-1] / GiB]
    ax.fill_between(t, gib, step="post", color=MEMORY_COLOR, alpha=0.25, linewidth=0)
    ax.step(t, gib, where="post", color=MEMORY_COLOR, linewidth=1.2,
            label=f"in use (peak {fmt_bytes(s.device_typical_peak_bytes)})")
    if s.device_peak_bytes > s.device_typical_peak_bytes:
        ax.axhline(s.device_peak_bytes / GiB, color=MEMORY_COLOR, linestyle=":", linewidth=1.0,
                   label=f"at most, whatever the timing: {fmt_bytes(s.device_peak_bytes)}")
    limit, peak = s.device_usable_bytes / GiB, s.device_peak_bytes / GiB
    label = f"usable limit {fmt_bytes(s.device_usable_bytes)}"
    if limit <= OFF_SCALE * peak:
        ax.axhline(limit, color=LIMIT_COLOR, linestyle="--", linewidth=1.2, label=label)
        ax.set_ylim(0, max(limit, peak) * 1.12)
    else:  # far above the curve: zoom on the curve, mark the limit at the top edge
        ax.set_ylim(0, peak * 1.3)
        ax.axhline(peak * 1.3, color=LIMIT_COLOR, linestyle="--", linewidth=2.0, clip_on=False,
                   label=f"{label}\n(off scale above; peak is {peak / limit:.1%} of it)")
    ax.set_xlim(0, s.step_time_s)
    ax.set_ylabel("device memory (GiB)")
    ax.set_xlabel("time (s)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def save_figure(fig: Figure, path, **savefig_kw) -> Path:
    """Save `fig` to `path` (format from the suffix); bad paths become a one-line HorizonError.
    The image is drawn in memory and written here: matplotlib's own writer lets an error on
    closing the file (a full disk) pass unreported."""
    path = Path(path)
    fmt = path.suffix[1:].lower()
    if fmt and fmt not in fig.canvas.get_supported_filetypes():
        raise HorizonError(f"cannot write plot {str(path)!r}: unknown image format {fmt!r}; "
                           f"use .png, .svg or .pdf")
    if not path.parent.is_dir():
        raise HorizonError(f"cannot write plot {str(path)!r}: directory {str(path.parent)!r} does not exist")
    refuse_non_regular(path, "cannot write plot", allow_chardev=True)  # a FIFO would block the open
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt or "png", **{"dpi": fig.dpi, **savefig_kw})
    return write_atomic(path, buf.getvalue(), "plot")  # a full disk leaves no truncated image


def plot_memory(result, path=None, title: str | None = None) -> Figure:
    """A standalone device-memory plot; saved to `path` when given. Returns the figure."""
    fig = Figure(figsize=(10, 3.5), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    draw_memory(ax, result)
    meta = result.schedule.meta
    ax.set_title(title or f"{meta.model.name}: device memory over one step")
    if path is not None:
        save_figure(fig, path)
    return fig
