"""Report section 6, scale out (data parallel, planned; the executor runs one device today):
tokens/s and host RAM per node against the number of nodes, and against devices per node, for
each model on its GPU boxes, with the scaling efficiency against one device. A plot of both."""
from pathlib import Path

import pandas as pd

from horizon_sim.plan import plan
from horizon_sim.plan.plan import scaling_efficiency
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import gib, md_table, ram_label, tps
from horizon_sim.report.out import DPI, Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.layout import Layout
from horizon_sim.units import TiB


def plot_scale_out(rows: list[dict], usable_bytes: int, path: Path) -> Path:
    """tokens/s (left) and host GiB per node (right) against nodes, one line per model."""
    from matplotlib.figure import Figure

    from horizon_sim.report.memory_plot import LIMIT_COLOR, save_figure

    df = pd.DataFrame(rows)
    df = df[df.sweep == "nodes"]
    fig = Figure(figsize=(11, 3.8), dpi=DPI, layout="constrained")
    speed, host = fig.subplots(1, 2)
    for model, g in df.groupby("model", sort=False):
        ok = g[g.fits]
        line = speed.plot(g.nodes, g.tokens_per_s, marker="o", markerfacecolor="white", linewidth=1.2,
                          label=model)[0]
        speed.plot(ok.nodes, ok.tokens_per_s, marker="o", linestyle="none", color=line.get_color(),
                   markerfacecolor=line.get_color())
        host.plot(g.nodes, g.host_bytes / TiB, marker="o", linewidth=1.2, color=line.get_color(), label=model)
    for ax in (speed, host):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes")
        ax.grid(alpha=0.3)
    speed.set_yscale("log")
    speed.set_ylabel("tokens/s of the job")
    speed.set_title("speed (filled: fits the node's RAM; open: does not)", fontsize=10, loc="left")
    host.axhline(usable_bytes / TiB, color=LIMIT_COLOR, linestyle="--", linewidth=1.0, label="usable per node")
    host.set_ylabel("host TiB per node")
    host.set_title("host RAM per node", fontsize=10, loc="left")
    host.legend(fontsize=8, frameon=False)
    return save_figure(fig, path)


def build_scale_out(cfg: BuildConfig, out: Out) -> Section:
    rows = []
    pol = cfg.scale_policy
    for name in cfg.scale_models:
        model = load_model(name)
        layouts = ([("nodes", cfg.scale_gpus_per_node, n) for n in cfg.scale_nodes]
                   + [("devices", g, 1) for g in cfg.scale_devices if g != cfg.scale_gpus_per_node])
        for sweep, g, n in layouts:
            hw = make_hardware(cfg.scale_gpu, cfg.scale_ram, layout=Layout(g, n))
            r = plan(model, hw, pol)
            s = r.summary
            rows.append({"model": model.name, "sweep": sweep, "devices_per_node": g, "nodes": n, "ranks": s.ranks,
                         "fits": s.fits, "tokens_per_s": s.tokens_per_s, "step_time_s": s.step_time_s,
                         "scaling_efficiency": scaling_efficiency(r), "host_bytes": s.host_bytes,
                         "host_bytes_per_param": s.host_bytes / model.total_params,
                         "device_peak_bytes": s.device_peak_bytes, "exposed_network_s": s.exposed_network_s,
                         "bottleneck": s.bottleneck, "why": s.why})
    usable = make_hardware(cfg.scale_gpu, cfg.scale_ram).host_bytes_usable
    plot_scale_out(rows, usable, out.path("scale_out.png"))
    pd.DataFrame(rows).to_csv(out.path("scale_out.csv"), index=False, float_format="%.6g")
    eff = lambda v: "" if v is None or v != v else f"{v:.0%}"  # noqa: E731 (None/NaN: one device)
    table = md_table(rows, [("model", "model", str, "l"), ("devices/node", "devices_per_node", str, "r"),
                            ("nodes", "nodes", str, "r"), ("fits", "fits", lambda f: "yes" if f else "no", "l"),
                            ("tokens/s", "tokens_per_s", tps, "r"), ("efficiency", "scaling_efficiency", eff, "r"),
                            ("host GiB/node", "host_bytes", gib, "r"),
                            ("B/param/node", "host_bytes_per_param", lambda v: f"{v:.2f}", "r"),
                            ("device GiB", "device_peak_bytes", gib, "r"),
                            ("collectives exposed s", "exposed_network_s", lambda v: f"{v:.2f}", "r"),
                            ("bottleneck", "bottleneck", str, "l")])
    out.text("scale_out.md", table + "\n")
    hw = make_hardware(cfg.scale_gpu, cfg.scale_ram, layout=Layout(cfg.scale_gpus_per_node, 2))
    c = hw.cluster
    first_fit = {}
    for r in rows:
        if r["sweep"] == "nodes" and r["fits"] and r["model"] not in first_fit:
            first_fit[r["model"]] = r
    fit_txt = "; ".join(f"{m} first fits on {r['nodes']} node(s) ({gib(r['host_bytes'])} GiB per node, "
                        f"{tps(r['tokens_per_s'])} tokens/s)" for m, r in first_fit.items()) or "no model fits"
    body = (f"**Planned, not yet executed on GPUs** (the executor runs these Schedules over processes: tested on "
            f"CPU ranks over gloo, NCCL written but never run on GPUs). {cfg.scale_gpu} boxes of "
            f"{cfg.scale_gpus_per_node} with {ram_label(cfg.scale_ram)} RAM per node, joined as `{c.name}` "
            f"(fabric {c.fabric_GBps:g} GB/s per device, network {c.net_GBps:g} GB/s per node: estimates, "
            f"`horizon_sim/specs/cluster.py`); every device runs batch {pol.batch} x {pol.seq}, optimizer "
            f"{pol.optimizer}, clip {pol.grad_clip:g}, checkpoints on {pol.act_ckpt_on}, working copy on "
            f"(several nodes need it). Host RAM per node is 2 bytes/param of working copy plus 12/M of master "
            f"and moments plus each rank's buffers; {fit_txt}. Efficiency: tokens/s against the number of "
            f"devices x one device's (above 100% where one device is optimizer-bound, since each rank "
            f"updates only its share).\n\n![scale out](scale_out.png)\n\n" + table
            + "\n\nFiles: [`scale_out.csv`](scale_out.csv), [`scale_out.md`](scale_out.md).")
    return Section("Scale out: nodes and devices per node (planned)", body, {"rows": rows})

