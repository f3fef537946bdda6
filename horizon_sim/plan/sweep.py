"""`horizon sweep`: every configuration of a grid (plan/grid.py) simulated into one table,
and where its results and feasibility map are written."""
import itertools
from pathlib import Path

import pandas as pd

from horizon_sim.errors import HorizonError
from horizon_sim.plan.grid import POLICY_FIELDS, Grid
from horizon_sim.plan.outcome import Outcome
from horizon_sim.plan.peers import PEER_COLUMNS, peer_row
from horizon_sim.plan.runner import Runner
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.layout import Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB

MAX_MAP_ROWS = MAX_MAP_COLUMNS = 64
"""Models (rows) and RAM sizes (columns) the feasibility map draws: one labelled cell each,
about an inch wide, so a larger map would be an unreadable image of hundreds of megabytes."""
MAX_MAP_PANELS = 16
"""GPU x link panels of the map, side by side."""

RESULT_COLUMNS = ("model", "params", "gpu", "link", "host", "devices_per_node", "nodes", "ram_bytes",
                  *POLICY_FIELDS, "fits",
                  "step_time_s", "tokens_per_s", "mfu", "device_peak_bytes", "device_usable_bytes",
                  "host_bytes", "host_usable_bytes", "bottleneck", "error")


def outcome_row(model: ModelSpec, hw: HardwareSpec, policy_fields: dict, out: Outcome) -> dict:
    """One table row: what was simulated, and what it predicts on this machine."""
    return {"model": model.name, "params": model.total_params, "gpu": hw.device.name,
            "link": hw.link.name, "host": hw.host.name, "devices_per_node": hw.cluster.layout.devices_per_node,
            "nodes": hw.cluster.layout.nodes, "ram_bytes": int(round(hw.host.ram_GiB * GiB)),
            **{f: policy_fields.get(f) for f in POLICY_FIELDS}, "fits": out.fits(hw),
            "step_time_s": out.step_time_s, "tokens_per_s": out.tokens_per_s, "mfu": out.mfu,
            "device_peak_bytes": out.device_peak_bytes, "device_usable_bytes": hw.device_bytes_usable,
            "host_bytes": out.host_bytes, "host_usable_bytes": hw.host_bytes_usable,
            "bottleneck": out.bottleneck, "error": out.error}


def sweep(grid: Grid, *, workers: int | None = None, progress: bool = False,
          compare: str | None = None) -> pd.DataFrame:
    """One row per configuration of the grid (columns RESULT_COLUMNS). Invalid policies are
    rows with `error` set and fits False. compare='zero3-offload': the peer's step on the same
    model, machine and batch too (PEER_COLUMNS)."""
    hws = {}
    for gpu, link, host, (g, n), c in itertools.product(grid.gpus, grid.links, grid.hosts, grid.layouts,
                                                        grid.clusters):
        for ram in grid.ram_bytes:
            hws[gpu, link, host, g, n, c, ram] = make_hardware(gpu, ram, link, host, layout=Layout(g, n), cluster=c)
    configs = []  # (model, hw, fields, policy or error)
    for model in grid.models:
        for fields_ in grid.policies():
            try:
                pol, err = Policy(**fields_), ""
            except (HorizonError, TypeError) as e:
                pol, err = None, str(e).splitlines()[0]
            for hw in hws.values():
                configs.append((model, hw, fields_, pol, err))
    runnable = [(m, hw, pol) for m, hw, _, pol, err in configs if pol is not None]
    peers = [(*t, compare) for t in runnable] if compare else []
    with Runner(workers, progress, desc="sweep", known_total=True) as runner:
        done = runner.run(runnable + peers)
    outs, peer_outs = iter(done[:len(runnable)]), iter(done[len(runnable):])
    rows = []
    for m, hw, fields_, pol, err in configs:
        out = next(outs) if pol is not None else Outcome(error=err)
        row = outcome_row(m, hw, pol.to_dict() if pol is not None else fields_, out)  # the master resolved
        if compare:
            row.update(peer_row(hw, out, next(peer_outs) if pol is not None else Outcome(error=err)))
        rows.append(row)
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS) + (list(PEER_COLUMNS) if compare else []))


OUTPUT_SUFFIXES = (".csv", ".parquet")


def check_output(path) -> Path:
    """Fail before simulating when the results cannot be written."""
    p = Path(path)
    if p.suffix.lower() not in OUTPUT_SUFFIXES:
        raise HorizonError(f"-o {str(p)!r}: the results file must end in .csv or .parquet")
    if p.is_dir():
        raise HorizonError(f"-o {str(p)!r} is a directory; give a file name like results.csv")
    if not p.parent.is_dir():
        raise HorizonError(f"-o {str(p)!r}: directory {str(p.parent)!r} does not exist")
    if p.suffix.lower() == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise HorizonError(f"-o {str(p)!r}: writing .parquet needs pyarrow (pip install pyarrow); "
                               f"or write {p.with_suffix('.csv').name}") from None
    return p


def write_results(df: pd.DataFrame, path) -> Path:
    p = check_output(path)
    if p.suffix.lower() == ".parquet":
        df.to_parquet(p, index=False)
    else:
        df.to_csv(p, index=False)
    return p


def check_map(grid: Grid) -> None:
    """Fail before simulating when the grid's feasibility map would be too big to draw."""
    panels = len(grid.gpus) * len(grid.links) * len(grid.layouts)
    for what, n, limit in (("models", len({m.name for m in grid.models}), MAX_MAP_ROWS),
                           ("RAM sizes", len(set(grid.ram_bytes)), MAX_MAP_COLUMNS),
                           ("GPU x link x layout panels", panels, MAX_MAP_PANELS)):
        if n > limit:
            raise HorizonError(f"the feasibility map draws at most {limit} {what}; the grid has {n}: "
                               "use --no-plot (the table has every row), or fewer values")


def map_path(results_path) -> Path:
    """Where the feasibility map goes: next to the results, same stem, .png."""
    p = Path(results_path)
    return p.with_name(p.stem + ".png")
