"""Report section 10, where the throughput comes from (planned): on each case's machine and
batch, the step as it was (micro-batch by micro-batch, every layer's forward recomputed in
backward), then with the layer order (each unit's weights cross the link twice a step however
many micro-batches pass it), then also keeping the activations of as many of the last layers as
the device holds (their backward runs from autograd's saved tensors: no recompute). Tokens/s,
MFU, HFU (recompute counted) and the bytes that cross the link per step show which cost each
change removes."""
from dataclasses import replace

import pandas as pd

from horizon_sim.plan import plan
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.fmt import md_table, tps
from horizon_sim.report.out import Out, Section
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.policy import KEEP_ALL, Policy


def _keep_candidates(n_layers: int) -> list[int]:
    """Kept-layer counts tried, most first: all, then halving."""
    out, k = [KEEP_ALL], n_layers // 2
    while k >= 1:
        out.append(k)
        k //= 2
    return out


def _row(case: str, change: str, model, hw, pol: Policy) -> dict:
    r = plan(model, hw, pol)
    s = r.summary
    kept = model.n_layers if pol.keep_last == KEEP_ALL else pol.keep_last
    return {"case": case, "change": change, "mb_order": pol.mb_order, "kept_layers": kept,
            "tokens_per_s": s.tokens_per_s, "mfu": s.mfu, "hfu": s.hfu,
            "link_GB_per_step": sum(op.link_bytes for op in r.schedule.ops) / 1e9,
            "device_peak_GiB": s.device_peak_bytes / 2**30, "device_fits": s.memory.device_fits,
            "fits": s.fits, "bottleneck": s.bottleneck}


def _most_kept(model, hw, pol: Policy) -> Policy | None:
    """The layer-order policy keeping the most layers that still fits the device, or None."""
    for k in _keep_candidates(model.n_layers):
        p = replace(pol, keep_last=k)
        if plan(model, hw, p).summary.memory.device_fits:
            return p
    return None


def build_throughput(cfg: BuildConfig, out: Out) -> Section:
    rows = []
    for name, gpu, ram, pol in cfg.throughput_cases:
        model, hw = load_model(name), make_hardware(gpu, ram)
        case = f"{name} on {gpu} + {ram}, {pol.batch} x {pol.seq} in {pol.micro_batches} micro-batch(es)"
        before = replace(pol, mb_order="micro", keep_last=0)
        layer = replace(before, mb_order="layer")
        rows.append(_row(case, "before: micro-batch order, recompute every layer", model, hw, before))
        rows.append(_row(case, "layer order", model, hw, layer))
        kept = _most_kept(model, hw, layer)
        if kept is not None and kept.keep_last:
            rows.append(_row(case, "layer order, kept activations", model, hw, kept))
    pd.DataFrame(rows).to_csv(out.path("throughput.csv"), index=False, float_format="%.6g")
    yes = lambda f: "yes" if f else "**no**"  # noqa: E731
    table = md_table(rows, [("case", "case", str, "l"), ("change", "change", str, "l"),
                            ("kept layers", "kept_layers", str, "r"), ("tokens/s", "tokens_per_s", tps, "r"),
                            ("MFU", "mfu", lambda v: f"{v:.1%}", "r"), ("HFU", "hfu", lambda v: f"{v:.1%}", "r"),
                            ("link GB/step", "link_GB_per_step", lambda v: f"{v:,.1f}", "r"),
                            ("device peak GiB", "device_peak_GiB", lambda v: f"{v:.1f}", "r"),
                            ("device fits", "device_fits", yes, "l"), ("fits", "fits", yes, "l"),
                            ("bottleneck", "bottleneck", str, "l")])
    text = ("Planned, not measured on GPUs. Each case keeps its machine, batch and micro-batches and changes one "
            "thing at a time: the layer order (`--mb-order layer`: every micro-batch passes a unit while its weights "
            "are resident, so the weights cross the link twice a step instead of twice per micro-batch), then the "
            "activations of the last layers kept on the device (`--keep-activations L`, the most layers the device "
            "holds: their backward runs from the saved tensors, so HFU falls toward MFU). With one micro-batch the "
            "two orders are the same step. \"fits\" also needs the host RAM; a case that does not fit still shows "
            "where its time goes.\n\n" + table + "\n\nFile: [`throughput.csv`](throughput.csv).")
    return Section("Where the throughput comes from (planned)", text, {"rows": rows})
