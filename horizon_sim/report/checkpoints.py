"""Report section 4, checkpoint placement: each model planned with checkpoints on the device and
on the host, device memory over one step for both (plot_ckpt_memory), and a table of device
peak, step time and host RAM per placement."""
from dataclasses import replace
from pathlib import Path

import pandas as pd

from horizon_sim.plan import plan
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import gib, md_table, pct, ram_label, secs, tps
from horizon_sim.report.out import DPI, Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.units import GiB, fmt_bytes

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
            r = plan(model, hw, replace(cfg.ckpt_policy, act_ckpt_on=place))
            results[model.name][place] = r
            s = r.summary
            rows.append({"model": model.name, "act_ckpt_on": place, "fits": s.fits,
                         "device_peak_bytes": s.device_peak_bytes, "step_time_s": s.step_time_s,
                         "tokens_per_s": s.tokens_per_s, "host_bytes": s.host_bytes,
                         "h2d_busy": s.lane_busy.get("h2d", 0.0), "d2h_busy": s.lane_busy.get("d2h", 0.0),
                         "bottleneck": s.bottleneck})
    plot_ckpt_memory(results, out.path("ckpt_memory.png"))
    pd.DataFrame(rows).to_csv(out.path("ckpt_placement.csv"), index=False, float_format="%.6g")
    table = md_table(rows, [("model", "model", str, "l"), ("checkpoints on", "act_ckpt_on", str, "l"),
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
            f"K={pol.act_ckpt_every}, otherwise the default policy. On the host, device memory stays independent of "
            f"depth; on the device, boundary activations accumulate through forward and are freed in backward.\n\n"
            + "; ".join(parts) + ".\n\n![checkpoint memory](ckpt_memory.png)\n\n" + table
            + "\n\nFiles: [`ckpt_placement.csv`](ckpt_placement.csv), [`ckpt_placement.md`](ckpt_placement.md).")
    return Section("Checkpoints on the device vs on the host", body, {"rows": rows})
