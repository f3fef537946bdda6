"""Report section 9: the planner against published GPU measurements (horizon_sim/published):
the same table `horizon validate --published` prints, its plot, and the medians per quantity."""
from horizon_sim.published import load_rows, run_suite
from horizon_sim.published.write import write_published
from horizon_sim.report.config import BuildConfig
from horizon_sim.report.out import Out, Section


def build_published(cfg: BuildConfig, out: Out) -> Section:
    res = run_suite(load_rows())
    for name in ("published.csv", "published.md", "published.png"):
        out.path(name)
    write_published(res, out.root)
    f = res.figures()
    parts = _parts(f["groups"])
    if f["held_out_groups"]:
        parts.append(f"and on the {f['held_out_rows']} held-out rows (entered to test the planner, never used to build "
                     "it): " + ", ".join(_parts(f["held_out_groups"])))
    text = (f"Every published measurement in `horizon_sim/published/measurements.toml` ({f['rows']} rows from "
            f"{f['sources']} sources, each with its citation), planned on the setup its source ran "
            f"(`horizon validate --published`): " + "; ".join(parts) + ". Rows the planner cannot model are "
            "listed with the reason, not dropped. Throughput in TFLOPS is recomputed from the planned tokens/s "
            "in each source's own counting (6 or 8 x params x tokens/s).\n\n![published](published.png)\n\n"
            "```\n" + res.text() + "\n```\n\n([published.md](published.md) adds every source; "
            "[published.csv](published.csv) the figures.)")
    return Section("Against published measurements", text, {"figures": f})


def _parts(g: dict) -> list[str]:
    parts = [f"{k}: median |error| {m['median_abs_err']:.0%} over {m['rows']} rows (worst {m['max_abs_err']:.0%})"
             for k, m in g.items() if k != "fit"]
    if "fit" in g:
        parts.append(f"fit verdicts {g['fit']['rows'] - g['fit']['wrong']} of {g['fit']['rows']} right")
    return parts
