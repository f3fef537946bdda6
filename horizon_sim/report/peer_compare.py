"""Report section 7, the peer (planned): Horizon against DeepSpeed ZeRO-3 offload on the paper's
platforms (A100 80 GB + 256 GB, H100 + 512 GB, H200 + 1.5 TB) for models of 7B to 120B, and the
width and depth scaling on the H200: fits, tokens/s, speedup, the peer's bottleneck and the
first reason they differ (horizon_sim/peer/compare.py). A plot of tokens/s against parameters."""
from pathlib import Path

import pandas as pd

from horizon_sim.peer.compare import plan_zero3, why_text, zero3_like
from horizon_sim.plan import plan
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import gib, md_table, tps
from horizon_sim.report.out import DPI, Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.model import ModelSpec


def scaled(width: int, depth: int) -> ModelSpec:
    """A Llama-3-style dense model of `depth` layers at `width` (SwiGLU 3.5x, head dim 128, 8 kv
    heads (fewer when the width has fewer heads), vocabulary 128256): the paper's width and depth
    sweeps."""
    heads = max(1, width // 128)
    return ModelSpec(name=f"w{width}-d{depth}", n_layers=depth, hidden=width, n_heads=heads, n_kv_heads=min(8, heads),
                     ffn_hidden=int(3.5 * width) // 256 * 256, vocab=128256, norm_eps=1e-5, rope_theta=5e5)


def _row(sweep: str, model: ModelSpec, gpu: str, ram: str, policy) -> dict:
    hw = make_hardware(gpu, ram)
    ours = plan(model, hw, policy)
    zero3 = zero3_like(policy)
    peer = plan_zero3(model, hw, zero3)
    a, b = ours.summary, peer.summary
    why = [t for t in why_text(ours, peer)[1:] if not t.startswith(("Horizon does not", "The peer does not"))]
    return {"sweep": sweep, "model": model.name, "params_B": model.total_params / 1e9, "gpu": gpu, "ram": ram,
            "horizon_fits": a.fits, "peer_fits": b.fits, "horizon_tokens_per_s": a.tokens_per_s,
            "peer_tokens_per_s": b.tokens_per_s, "speedup": a.tokens_per_s / b.tokens_per_s,
            "horizon_host_bytes": a.host_bytes, "peer_host_bytes": b.host_bytes,
            "horizon_device_bytes": a.device_peak_bytes, "peer_device_bytes": b.device_peak_bytes,
            "peer_bottleneck": b.bottleneck, "peer_why_not": "" if b.fits else b.why,
            "why": why[0] if why else ""}


def plot_peer(rows: list[dict], path: Path) -> Path:
    """tokens/s of both against parameters, one panel per platform; open markers: does not fit."""
    from matplotlib.figure import Figure

    from horizon_sim.report.memory_plot import save_figure
    df = pd.DataFrame(rows)
    df = df[df.sweep == "platforms"]
    plats = list(dict.fromkeys(zip(df.gpu, df.ram)))
    fig = Figure(figsize=(4 * len(plats), 3.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, len(plats), squeeze=False)[0]
    for ax, (gpu, ram) in zip(axes, plats):
        g = df[(df.gpu == gpu) & (df.ram == ram)]
        for who, col, color in (("Horizon", "horizon", "#4c72b0"), ("ZeRO-3 offload", "peer", "#dd8452")):
            ax.plot(g.params_B, g[f"{col}_tokens_per_s"], color=color, linewidth=1.2, label=who)
            fit = g[g[f"{col}_fits"]]
            nofit = g[~g[f"{col}_fits"]]
            ax.plot(fit.params_B, fit[f"{col}_tokens_per_s"], "o", color=color)
            ax.plot(nofit.params_B, nofit[f"{col}_tokens_per_s"], "o", color=color, markerfacecolor="white")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters (B)")
        ax.set_title(f"{gpu} + {ram}", fontsize=10, loc="left")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens/s (open: does not fit)")
    axes[0].legend(fontsize=8, frameon=False)
    return save_figure(fig, path)


def build_peer_compare(cfg: BuildConfig, out: Out) -> Section:
    pol = cfg.peer_policy
    rows = [_row("platforms", load_model(m), gpu, ram, pol) for gpu, ram in cfg.peer_platforms for m in cfg.peer_models]
    gpu, ram = cfg.peer_scaling_machine
    rows += [_row("depth", scaled(cfg.peer_width, d), gpu, ram, pol) for d in cfg.peer_depths]
    rows += [_row("width", scaled(w, cfg.peer_depth), gpu, ram, pol) for w in cfg.peer_widths]
    plot_peer(rows, out.path("peer_compare.png"))
    pd.DataFrame(rows).to_csv(out.path("peer_compare.csv"), index=False, float_format="%.6g")
    yes = lambda f: "yes" if f else "**no**"  # noqa: E731
    table = md_table(rows, [("sweep", "sweep", str, "l"), ("model", "model", str, "l"),
                            ("B params", "params_B", lambda v: f"{v:.1f}", "r"), ("GPU", "gpu", str, "l"),
                            ("RAM", "ram", str, "l"), ("Horizon fits", "horizon_fits", yes, "l"),
                            ("peer fits", "peer_fits", yes, "l"),
                            ("Horizon tok/s", "horizon_tokens_per_s", tps, "r"),
                            ("peer tok/s", "peer_tokens_per_s", tps, "r"),
                            ("speedup", "speedup", lambda v: f"{v:.2f}x", "r"),
                            ("Horizon host GiB", "horizon_host_bytes", gib, "r"),
                            ("peer host GiB", "peer_host_bytes", gib, "r"),
                            ("peer device GiB", "peer_device_bytes", gib, "r"),
                            ("peer bottleneck", "peer_bottleneck", str, "l")])
    why = "\n".join(f"- {r['model']} on {r['gpu']} + {r['ram']}: {r['why']}" for r in rows if r["why"])
    out.text("peer_compare.md", table + "\n\nWhere the difference comes from (first reason per row):\n\n" + why + "\n")
    both = [r for r in rows if r["horizon_fits"] and r["peer_fits"]]
    only = [r for r in rows if r["horizon_fits"] and not r["peer_fits"]]
    lo, hi = (min(r["speedup"] for r in both), max(r["speedup"] for r in both)) if both else (0, 0)
    lead = (f"where both fit Horizon is {lo:.2f}x to {hi:.2f}x the peer's tokens/s" if both
            else "no configuration fits both")
    text = (f"Planned, not measured on GPUs: Horizon's default policy against DeepSpeed ZeRO-3 with parameters and "
            f"optimizer offloaded to CPU (`horizon plan --compare zero3-offload`; DeepSpeed's defaults, activation "
            f"checkpointing on) at batch {pol.batch} x {pol.seq}, on {len(cfg.peer_platforms)} platforms and a width "
            f"and depth sweep on {gpu} + {ram}. {lead[0].upper() + lead[1:]}; {len(only)} configuration(s) fit only "
            f"Horizon. The peer's model is checked against real DeepSpeed runs on a CPU by `horizon validate --peer "
            f"zero3-offload`.\n\n![peer](peer_compare.png)\n\n" + table + "\n\n([peer_compare.md](peer_compare.md) gives "
            "the reasons; [peer_compare.csv](peer_compare.csv) the figures.)")
    return Section("Against DeepSpeed ZeRO-3 offload (planned)", text, {"rows": rows})
