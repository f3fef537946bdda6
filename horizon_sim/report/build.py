"""Regenerate the planner part of reports/: figures, tables and reports/README.md, all from
the planner's own APIs (plan, advise, tune, min_ram, sweep, the Gantt and memory plots).

    python -m horizon_sim.report.build [--out reports] [--workers N] [--quick]

Sections (each a module of this package that writes its files and returns its README text):
  1. headline.py         dense-120b on an H200 with 1.5 TB of RAM: the default policy's verdict,
                         the nearest policy that fits (advise) and the fastest (tune), with a
                         Gantt and a trace
  2. fit_table.py        7B/14B/32B on A100-80GB and H100-PCIe with 256 GiB..1 TiB: default vs tuned
  3. optimizer_modes.py  the three optimizer overlap modes on one model, stacked Gantt panels
  4. checkpoints.py      checkpoints on the device vs on the host: device peak, step time, memory plot
  5. feasibility.py      presets x RAM sizes on an H100-PCIe (plan.sweep), default and lean policies
  6. scale_out.py        data parallel (planned): tokens/s and host RAM per node against nodes and devices
  7. peer_compare.py     against DeepSpeed ZeRO-3 offload (planned) on the paper's platforms, 7B-120B,
                         and its width and depth sweeps
  8. host_bytes.py       host bytes per parameter of each host-memory policy (split master, bf16
                         master, disk tier) for dense-120b on an H200 with 1.5 TB, and max-model
                         under each exact-fp32 policy set
  9. published.py        the planner against published GPU measurements (horizon_sim/published)
 10. throughput.py       where the throughput comes from: the layer order and kept activations,
                         one change at a time, on three machines
 11. moe.py              mixture-of-experts (Qwen3-MoE, Mixtral) on one GPU box: fits, speed, MFU
                         on active parameters, the limit, the RAM to buy
 12. adapters.py         LoRA on a frozen base: the largest model per machine against full
                         fine-tuning
The README around them (what is estimated, predicted vs measured, contents) is readme.py; what
each section covers is config.py (FULL, QUICK); output bookkeeping is out.py; formatting fmt.py.

The build owns only the files it writes. It records them in reports/.planner-build-files and,
on the next run, deletes those it no longer writes; every other file in reports/ (e.g. the
output of `horizon validate`) is left alone. No wall-clock dates are written, so an unchanged
planner gives byte-identical tables and traces.
"""
import argparse
import sys
import time
from pathlib import Path

from horizon_sim.plan.runner import Runner
from horizon_sim.report.checkpoints import build_checkpoints
from horizon_sim.report.config import FULL, QUICK, BuildConfig
from horizon_sim.report.frontier import build_frontier
from horizon_sim.report.feasibility import build_feasibility
from horizon_sim.report.scale_out import build_scale_out
from horizon_sim.report.fit_table import build_fit_table
from horizon_sim.report.headline import build_headline
from horizon_sim.report.host_bytes import build_host_bytes
from horizon_sim.report.optimizer_modes import MODES, build_optimizer_modes
from horizon_sim.report.peer_compare import build_peer_compare
from horizon_sim.report.published import build_published
from horizon_sim.report.moe import build_moe
from horizon_sim.report.adapters import build_adapters
from horizon_sim.report.throughput import build_throughput
from horizon_sim.report.out import MANIFEST, Out, log
from horizon_sim.report.readme import estimates_section, numbered, validate_section, write_readme

__all__ = ["FULL", "MANIFEST", "MODES", "QUICK", "BuildConfig", "build", "main"]


def build(out_dir="reports", *, quick: bool = False, workers: int | None = None,
          config: BuildConfig | None = None) -> dict:
    """Regenerate every planner report into `out_dir`. Returns {section key: Section}, plus
    'files' (what was written) and 'elapsed_s'."""
    cfg = config or (QUICK if quick else FULL)
    out = Out(Path(out_dir))
    t_all = time.perf_counter()
    sections = {}
    log(f"building planner reports into {out.root}/" + (" (quick)" if quick else ""))
    with Runner(workers) as runner:
        t = time.perf_counter()
        sections["headline"] = build_headline(cfg, out, runner)
        log(f"1/13 headline: {cfg.headline_model} on {cfg.headline_gpu}", t)
        t = time.perf_counter()
        sections["fit_table"] = build_fit_table(cfg, out, runner)
        log(f"2/13 default vs tuned: {' x '.join(', '.join(v) for v in (cfg.table_models, cfg.table_gpus, cfg.table_rams))}", t)
    t = time.perf_counter()
    sections["optimizer"] = build_optimizer_modes(cfg, out)
    log(f"3/13 optimizer modes: {cfg.modes_model}", t)
    t = time.perf_counter()
    sections["checkpoints"] = build_checkpoints(cfg, out)
    log(f"4/13 checkpoint placement: {', '.join(cfg.ckpt_models)}", t)
    t = time.perf_counter()
    sections["feasibility"] = build_feasibility(cfg, out, workers)
    log(f"5/13 feasibility map: {len(cfg.map_models)} presets x {len(cfg.map_rams)} RAM sizes on {cfg.map_gpu}", t)
    t = time.perf_counter()
    sections["scale_out"] = build_scale_out(cfg, out)
    log(f"6/13 scale out: {', '.join(cfg.scale_models)} on {cfg.scale_gpu} boxes, nodes "
        f"{cfg.scale_nodes[0]}-{cfg.scale_nodes[-1]}", t)
    t = time.perf_counter()
    sections["peer"] = build_peer_compare(cfg, out)
    log(f"7/13 against DeepSpeed ZeRO-3 offload: {len(cfg.peer_models)} models on {len(cfg.peer_platforms)} platforms, "
        "width and depth sweeps", t)
    t = time.perf_counter()
    sections["host_bytes"] = build_host_bytes(cfg, out)
    log(f"8/13 host bytes per parameter: {cfg.host_model} on {cfg.host_gpu} with {cfg.host_ram}", t)
    t = time.perf_counter()
    sections["published"] = build_published(cfg, out)
    log("9/13 against published measurements", t)
    t = time.perf_counter()
    sections["throughput"] = build_throughput(cfg, out)
    log(f"10/13 where the throughput comes from: {len(cfg.throughput_cases)} cases", t)
    t = time.perf_counter()
    sections["moe"] = build_moe(cfg, out)
    log(f"11/13 mixture-of-experts: {len(cfg.moe_cases)} cases", t)
    t = time.perf_counter()
    sections["adapters"] = build_adapters(cfg, out, workers)
    log(f"12/13 adapters: {len(cfg.adapters_machines)} machines", t)
    t = time.perf_counter()
    sections["frontier"] = build_frontier(cfg, out)
    log(f"13/13 the frontier MoE models: {len(cfg.frontier_boxes)} boxes, {len(cfg.frontier_nodes[4])} node counts", t)
    ordered = [sections[k] for k in ("headline", "fit_table", "optimizer", "checkpoints", "feasibility", "scale_out",
                                     "peer", "host_bytes", "published", "throughput", "moe", "adapters", "frontier")]
    out.path("README.md")  # registered first, so the stale sweep and the file list know it is ours
    stale = out.remove_stale()
    write_readme(out, [estimates_section(cfg), *numbered(ordered), validate_section(out)], cfg)
    out.write_manifest()
    if stale:
        log(f"removed {len(stale)} file(s) an earlier build wrote: {', '.join(stale)}")
    size = sum((out.root / n).stat().st_size for n in out.written)
    log(f"wrote {len(out.written)} files, {size / 2**20:.2f} MiB, in {time.perf_counter() - t_all:.1f} s")
    return {**sections, "files": list(out.written), "elapsed_s": time.perf_counter() - t_all}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m horizon_sim.report.build",
        description="Regenerate the planner part of reports/ from scratch with the planner's own APIs: the "
                    "headline (dense-120b on one H200 with 1.5 TB RAM: the default policy's verdict, the "
                    "policy advise/tune finds, its Gantt plot and Perfetto trace), a default-vs-tuned table "
                    "for 8B/14B/32B models on A100-80GB and H100-PCIe, the three optimizer overlap modes, "
                    "checkpoints on device vs host, feasibility maps for H100-PCIe, and data-parallel scale out "
                    "(planned) for ~120B and 405B on H200 boxes, and Horizon against DeepSpeed ZeRO-3 offload (planned) on "
                    "the paper's platforms, the host bytes per parameter of each host-memory policy, and the planner against "
                    "published GPU measurements, and where the throughput comes from (layer order, kept "
                    "activations), mixture-of-experts models on one GPU box, and LoRA adapters on a frozen base; then reports/README.md "
                    "showing each. Only files this build wrote before are replaced or removed; other files "
                    "in the folder (e.g. from `horizon validate`) are kept. Progress goes to stderr.",
        epilog="example:  python -m horizon_sim.report.build --out reports   (what `make reports` runs)")
    p.add_argument("--out", default="reports", metavar="DIR", help="output folder (default: reports)")
    p.add_argument("--workers", type=int, default=None,
                   help="simulation processes for tune and sweep (default: all cores)")
    p.add_argument("--quick", action="store_true",
                   help="a reduced configuration (small models, few RAM sizes) for tests; seconds, not minutes")
    a = p.parse_args(argv)
    if a.workers is not None and a.workers < 1:
        p.error(f"--workers {a.workers} must be >= 1")
    res = build(a.out, quick=a.quick, workers=a.workers)
    h = res["headline"].data
    d, tb = h["default"], h.get("tuned")
    print(f"{h['model']} on {h['hardware']}: default policy {'fits' if d['fits'] else 'does not fit'}"
          + (f"; tuned policy {tb['tokens_per_s']:,.0f} tokens/s, MFU {tb['mfu']:.1%}" if tb else ""))
    print(f"wrote {len(res['files'])} files into {a.out}/ in {res['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
