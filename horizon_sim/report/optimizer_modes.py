"""Report section 3, optimizer overlap modes: one model planned with the optimizer after backward,
in backward (no clipping) and pipelined, drawn as stacked Gantt panels on one time axis
(plot_modes) with a table of step time and exposed optimizer time per mode."""
from dataclasses import replace
from pathlib import Path

import pandas as pd

from horizon_sim.plan import plan
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import md_table, pct, ram_label, secs, tps
from horizon_sim.report.out import DPI, Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model

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
        ax.set_title(f"optimizer {mode} (clip {pol.grad_clip:g}): step {s.step_time_s:.2f} s, "
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
    rows = [{"mode": m, "grad_clip": r.schedule.meta.policy.grad_clip, "step_time_s": r.summary.step_time_s,
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
    return Section("Optimizer overlap: after, backward, pipelined", body,
                   {m: r for m, r in zip(MODES, rows)})
