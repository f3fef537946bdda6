"""`horizon sweep`: simulate a grid of models x hardware x policies into one table and a map."""
import argparse
import json

from horizon_sim.cli.tune_cmd import add_run_args, positive
from horizon_sim.errors import HorizonError
from horizon_sim.schedule.op import PEERS
from horizon_sim.units import fmt_bytes

EXAMPLE = """example:
  horizon sweep grid.toml -o results.csv
  horizon sweep grid.toml -o results.parquet --workers 8 --json
  horizon sweep grid.toml --compare zero3-offload    # + DeepSpeed ZeRO-3 offload on every row

grid.toml (every value is one value or a list; [policy] takes any Policy field):
  models = ["llama-3.1-8b", "llama-3.1-70b", "dense-120b"]
  gpus   = ["h100-pcie", "h200"]
  ram    = ["256GiB", "512GiB", "1TB", "1.5TB"]
  links  = ["pcie-gen5"]              # optional: default is each GPU's own link
  [policy]
  batch      = [4, 8]
  act_ckpt_every = [1, 2]

Writes one row per configuration (model, params, gpu, ram_bytes, the policy fields, fits,
step_time_s, tokens_per_s, mfu, device_peak_bytes, host_bytes, bottleneck, error) and a
feasibility map next to it (results.png): model size against host RAM, coloured by the best
tokens/s that fits, x where nothing fits. A row that is invalid (e.g. a model past the size
limits) carries its error and the sweep goes on; a grid whose every row is invalid is an
error (exit 2, the table still written)."""


def configure(p: argparse.ArgumentParser) -> None:
    p.description = ("Simulate every configuration of a grid file (models x GPUs x links x RAM sizes x "
                     "policy values) on all cores; write a table (.csv, or .parquet with pyarrow) and a "
                     "feasibility map PNG.")
    p.epilog = EXAMPLE
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("grid", metavar="GRID.toml", help="the grid file")
    p.add_argument("-o", "--output", default="results.csv", metavar="FILE",
                   help="results table: .csv or .parquet (default results.csv); the map goes next to it as .png")
    p.add_argument("--no-plot", action="store_true", help="do not write the feasibility map")
    p.add_argument("--compare", default=None, choices=PEERS,
                   help="also simulate DeepSpeed ZeRO-3 offload on every configuration's model, machine and batch "
                        "(one device; DeepSpeed's defaults): adds peer_fits, peer_tokens_per_s, speedup, ... columns")
    add_run_args(p)


def run(a: argparse.Namespace) -> int:
    from horizon_sim.plan.grid import load_grid
    from horizon_sim.plan.sweep import check_map, check_output, map_path, sweep, write_results
    from horizon_sim.report.feasibility_map import feasibility_map

    positive("--workers", a.workers, allow_none=True)
    out = check_output(a.output)  # before any simulation
    grid = load_grid(a.grid)
    if not a.no_plot:
        check_map(grid)
    df = sweep(grid, workers=a.workers, progress=not a.quiet, compare=a.compare)
    write_results(df, out)
    n_err = int((df.error != "").sum())
    if len(df) and n_err == len(df):  # some invalid corners are a grid's nature; all of them is a bad grid
        raise HorizonError(f"every configuration of {a.grid} is invalid ({n_err} row(s), each with its error in "
                           f"{out}), e.g.: {df.error.iloc[0]}")
    png = None if a.no_plot else feasibility_map(df, map_path(out))
    ok = df[df.fits.astype(bool)]
    best = ok.loc[ok.tokens_per_s.idxmax()] if len(ok) else None
    peer = _peer_summary(df, a.compare) if a.compare else None
    if a.json:
        print(json.dumps({"rows": len(df), "fits": len(ok), "errors": n_err, "output": str(out),
                          **({"compare": peer} if peer else {}),
                          "plot": str(png) if png else None,
                          "best": None if best is None else {
                              "model": best.model, "gpu": best.gpu, "link": best.link,
                              "ram_bytes": int(best.ram_bytes), "tokens_per_s": float(best.tokens_per_s),
                              "batch": int(best.batch), "act_ckpt_every": int(best.act_ckpt_every)}}))
        return 0
    print(f"sweep: {len(df)} configurations ({len(grid.models)} models x {len(grid.gpus)} GPUs x "
          f"{len(grid.links)} links x {len(grid.hosts)} hosts x {len(grid.ram_bytes)} RAM sizes x "
          + (f"{len(grid.layouts) * len(grid.clusters)} layouts x " if len(grid.layouts) * len(grid.clusters) > 1
             else "")
          + f"{grid.n_policies} policies): {len(ok)} fit, {n_err} invalid")
    if best is not None:
        where = (f" on {int(best.nodes)} node(s) x {int(best.devices_per_node)}" if best.nodes * best.devices_per_node > 1
                 else " on")
        print(f"  fastest that fits: {best.model}{where} {best.gpu} + {best.link} with {fmt_bytes(best.ram_bytes)}"
              f"{' per node' if best.nodes * best.devices_per_node > 1 else ''}: {best.tokens_per_s:,.0f} tokens/s")
    if peer:
        print(f"  ZeRO-3 offload: {peer['peer_fits']} fit ({peer['only_horizon']} fit only Horizon, "
              f"{peer['only_peer']} only the peer); where both fit, Horizon's speedup median "
              + (f"{peer['median_speedup']:.2f}x (min {peer['min_speedup']:.2f}x, max {peer['max_speedup']:.2f}x)"
                 if peer["both"] else "-"))
    if n_err:
        first = df[df.error != ""].iloc[0]
        print(f"  invalid, e.g.: {first.error}")
    print(f"wrote {out}")
    if png:
        print(f"wrote {png}")
    return 0


def _peer_summary(df, peer_name: str) -> dict:
    both = df[df.fits.astype(bool) & df.peer_fits.astype(bool)]
    sp = both.speedup.dropna()
    return {"peer": peer_name, "peer_fits": int(df.peer_fits.astype(bool).sum()), "both": len(both),
            "only_horizon": int((df.fits.astype(bool) & ~df.peer_fits.astype(bool)).sum()),
            "only_peer": int((~df.fits.astype(bool) & df.peer_fits.astype(bool)).sum()),
            "median_speedup": float(sp.median()) if len(sp) else None,
            "min_speedup": float(sp.min()) if len(sp) else None, "max_speedup": float(sp.max()) if len(sp) else None}
