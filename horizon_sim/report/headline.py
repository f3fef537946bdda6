"""Report section 1, the headline: one big model on one GPU (dense-120b on an H200 with 1.5 TB of
RAM in the full report): the default policy's verdict and host footprint, the nearest policy that
fits (advise) and the fastest (tune), with a Gantt plot, a Perfetto trace and headline.json."""
import json
from dataclasses import replace

from horizon_sim.plan import plan
from horizon_sim.plan.advice import nearest_fit
from horizon_sim.plan.min_ram import min_ram
from horizon_sim.plan.runner import Runner
from horizon_sim.plan.tune import tune
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import flags_or_default, gib, md_table, policy_text, ram_label, secs
from horizon_sim.report.out import Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.units import GiB, fmt_bytes, parse_size


def build_headline(cfg: BuildConfig, out: Out, runner: Runner) -> Section:
    model = load_model(cfg.headline_model)
    hw = make_hardware(cfg.headline_gpu, cfg.headline_ram)
    base = cfg.headline_policy
    r0 = plan(model, hw, base)
    s0 = r0.summary
    nf = None if s0.fits else nearest_fit(model, hw, base, runner=runner)
    tr = tune(model, hw, seq=base.seq, base=replace(base, grad_clip=0.0), runner=runner)
    best = tr.best
    data = {"model": model.name, "params": model.total_params, "hardware": hw.name,
            "default": {"policy": base.to_dict(), "fits": s0.fits, "why": s0.why,
                        "tokens_per_s": s0.tokens_per_s, "step_time_s": s0.step_time_s, "mfu": s0.mfu,
                        "host_bytes": s0.host_bytes, "device_peak_bytes": s0.device_peak_bytes,
                        "host_breakdown_bytes": dict(r0.host.by_role)}}
    need0 = None
    if s0.device_peak_bytes <= hw.device_bytes_usable:
        need0 = min_ram(model, hw, base).ram_bytes
        data["default"]["min_ram_bytes"] = need0

    lines = [f"**Default policy** ({policy_text(base)}): "
             f"**{'fits' if s0.fits else 'does not fit'}**: {s0.why}."]
    if not s0.fits and need0:
        lines[-1] += (f" It would need {need0 // GiB:,} GiB of RAM installed (`horizon min-ram`), "
                      f"{(need0 - parse_size(cfg.headline_ram)) / GiB:,.0f} GiB more than the "
                      f"{ram_label(cfg.headline_ram)} here.")
    lines += ["", "Its host footprint, by role:", "",
              md_table([{"role": k, "b": v} for k, v in r0.host.by_role.items() if v >= GiB / 100]
                       + [{"role": "**total**", "b": s0.host_bytes}],
                       [("role", "role", str, "l"), ("GiB", "b", gib, "r"),
                        ("bytes/param", "b", lambda b: f"{b / model.total_params:.2f}", "r")]),
              ]
    pick = None
    if nf is not None:
        o = nf.outcome
        lines += ["", f"**Nearest policy that fits** (`advise`: changes that leave the training as it is first, then the fewest changes; here {', '.join(nf.changes)}): "
                      f"{flags_or_default(nf.policy, base)} -> {o.tokens_per_s:,.0f} tokens/s, MFU {o.mfu:.1%}, "
                      f"host {fmt_bytes(o.host_bytes)}, device {fmt_bytes(o.device_peak_bytes)}."]
        data["nearest_fit"] = {"changes": list(nf.changes), "policy": nf.policy.to_dict(),
                               "tokens_per_s": o.tokens_per_s, "mfu": o.mfu, "host_bytes": o.host_bytes,
                               "device_peak_bytes": o.device_peak_bytes}
        pick = nf.policy
    if best is not None:
        b = tr.table.iloc[0]
        lines += ["", f"**Tuned policy** (`tune`: the fastest that fits of {tr.evaluated} configurations "
                      f"simulated, from the default with clipping off so the optimizer may run in backward; "
                      f"moments stay fp32): "
                      f"{flags_or_default(best, base)} -> {b.tokens_per_s:,.0f} tokens/s, step "
                      f"{secs(b.step_time_s)}, MFU {b.mfu:.1%}, host {fmt_bytes(b.host_bytes)}, "
                      f"device {fmt_bytes(b.device_peak_bytes)}, limited by {b.bottleneck}."]
        data["tuned"] = {"policy": best.to_dict(), "tokens_per_s": float(b.tokens_per_s),
                         "step_time_s": float(b.step_time_s), "mfu": float(b.mfu),
                         "host_bytes": int(b.host_bytes), "device_peak_bytes": int(b.device_peak_bytes),
                         "evaluated": tr.evaluated}
        pick = best
    elif nf is None:
        lines += ["", "Neither `advise` (3 changes) nor `tune` finds a policy that fits."]
    if pick is None and s0.fits:
        pick = base

    if pick is not None:
        from horizon_sim.report.gantt import plot_overlap
        from horizon_sim.report.trace import write_trace
        rp = plan(model, hw, pick)
        plot_overlap(rp, out.path("headline_overlap.png"))
        write_trace(rp, out.path("headline_trace.json"))
        sp = rp.summary
        busy = sp.lane_busy
        lines += ["", "![headline overlap](headline_overlap.png)", "",
                  f"The {'tuned' if pick is best else 'nearest-fit' if nf is not None and pick is nf.policy else 'default'} "
                  f"step: compute is busy "
                  f"{busy.get('compute', 0):.0%} of the {secs(sp.step_time_s)} step and waits "
                  f"{sp.exposed_copy_s:.2f} s on copies and {sp.exposed_optimizer_s:.2f} s on the CPU optimizer; "
                  f"device memory peaks at {fmt_bytes(sp.device_peak_bytes)} of "
                  f"{fmt_bytes(sp.device_usable_bytes)} usable. "
                  "Trace for [ui.perfetto.dev](https://ui.perfetto.dev): "
                  "[`headline_trace.json`](headline_trace.json)."]
        data["shown"] = {"policy": pick.to_dict(), "step_time_s": sp.step_time_s,
                         "exposed_copy_s": sp.exposed_copy_s, "exposed_optimizer_s": sp.exposed_optimizer_s}
    out.text("headline.json", json.dumps(data, indent=1, default=str) + "\n")
    lines += ["", "Numbers: [`headline.json`](headline.json)."]
    title = (f"Headline: {model.name} ({model.total_params / 1e9:.1f}B) on one {hw.device.name} "
             f"with {ram_label(cfg.headline_ram)} of RAM")
    return Section(title, "\n".join(lines), data)
