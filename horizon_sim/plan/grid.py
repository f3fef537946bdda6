"""The grid file of `horizon sweep`: models x hardware x policies, read from TOML. Every value
may be one value or a list of values:

    models = ["llama-3.1-8b", "qwen2.5-14b"]   # presets or config.json paths (relative to the file)
    gpus   = ["h100-pcie", "h200"]
    ram    = ["256GiB", "512GiB", "1TB"]
    links  = ["pcie-gen4", "pcie-gen5"]          # optional; default: each GPU's own link
    hosts  = ["default"]                         # optional host presets
    gpus_per_node = [1, 8]                       # optional data-parallel layouts (default 1 x 1):
    nodes  = [1, 2, 4]                           #   every combination; RAM is per node
    cluster = ["hgx-h100"]                       # optional: what joins them (default: the GPU's box)
    [policy]                                     # optional; any Policy field, lists of values
    batch = [4, 8]
    act_ckpt_every = [1, 2]
"""
import itertools
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.safe_read import read_toml
from horizon_sim.specs.cluster import cluster_preset, make_cluster
from horizon_sim.specs.layout import MAX_DEVICES_PER_NODE, MAX_NODES, Layout
from horizon_sim.specs.hardware_presets import device_preset, host_preset, link_preset
from horizon_sim.specs.hf_config import load_model
from horizon_sim.specs.policy import Policy
from horizon_sim.units import parse_size, refuse_unknown

POLICY_FIELDS = tuple(f.name for f in fields(Policy))
MAX_SWEEP_SIMULATIONS = 10_000
"""Simulations one sweep runs (RAM sizes are free: plan/runner.py). A 7B-class configuration
takes ~0.1 s of one core, so 10,000 are minutes on a small machine; a bigger grid is split."""
GRID_KEYS = ("models", "gpus", "ram", "links", "hosts", "gpus_per_node", "nodes", "cluster", "policy")
_REQUIRED = ("models", "gpus", "ram")


@dataclass(frozen=True)
class Grid:
    """Models x GPUs x links x hosts x RAM sizes x policy combinations."""

    models: tuple  # ModelSpec
    gpus: tuple[str, ...]
    ram_bytes: tuple[int, ...]
    """Installed RAM sizes (the grid file's `ram`)."""
    links: tuple = (None,)
    """Link preset names; None = each GPU's default link."""
    hosts: tuple[str, ...] = ("default",)
    layouts: tuple = ((1, 1),)
    """(devices per node, nodes) pairs."""
    clusters: tuple = (None,)
    """Cluster preset names; None = each GPU's usual box."""
    policy: dict = field(default_factory=dict)
    """Policy field -> tuple of values."""

    def policies(self) -> list[dict]:
        """Every combination of the policy values (Policy defaults for the rest; the master's
        left to Policy to resolve per combination: split where it can be)."""
        keys = list(self.policy)
        base = {**Policy().to_dict(), "master_dtype": None, "split_master": None}
        return [{**base, **dict(zip(keys, combo))}
                for combo in itertools.product(*(self.policy[k] for k in keys))]

    @property
    def n_policies(self) -> int:
        return math.prod(len(v) for v in self.policy.values())

    @property
    def n_simulations(self) -> int:
        """Configurations simulated: every one but the RAM size (plan/runner.py)."""
        return (len(self.models) * len(self.gpus) * len(self.links) * len(self.hosts) * len(self.layouts)
                * len(self.clusters) * self.n_policies)

    def __len__(self) -> int:
        return self.n_simulations * len(self.ram_bytes)


def _as_list(where: str, key: str, v) -> list:
    vals = v if isinstance(v, list) else [v]
    if not vals:
        raise HorizonError(f"{where}: {key} is an empty list; give at least one value")
    return vals


def parse_grid(data: dict, where: str = "grid", base_dir: Path | None = None) -> Grid:
    """A Grid from the dict of a TOML grid file; every problem is a one-line HorizonError."""
    if not isinstance(data, dict):
        raise HorizonError(f"{where}: a grid is a table of keys {', '.join(GRID_KEYS)}")
    refuse_unknown(data, GRID_KEYS, where)
    for k in _REQUIRED:
        if k not in data:
            raise HorizonError(f"{where}: required key {k!r} is missing (needs {', '.join(_REQUIRED)})")

    def strings(key):
        vals = _as_list(where, key, data[key])
        for v in vals:
            if not isinstance(v, str):
                raise HorizonError(f"{where}: {key} value {v!r} must be a string")
        return vals

    models = []
    for name in strings("models"):
        p = Path(name)
        if base_dir is not None and not p.is_absolute() and (name.endswith(".json") or (base_dir / p).exists()):
            name = str(base_dir / p)
        models.append(load_model(name))
    gpus = [device_preset(g).name for g in strings("gpus")]
    links = [link_preset(x).name for x in strings("links")] if "links" in data else [None]
    hosts = [host_preset(h).name for h in strings("hosts")] if "hosts" in data else ["default"]
    ram = []
    for v in _as_list(where, "ram", data["ram"]):
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise HorizonError(f"{where}: ram value {v!r} must be a size like '512GiB'")
        ram.append(parse_size(v, f"{where}: ram"))
    def counts(key, hi):
        vals = _as_list(where, key, data.get(key, 1))
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise HorizonError(f"{where}: {key} value {v!r} must be a whole number from 1 to {hi}")
        return vals

    layouts = [(g, n) for g in counts("gpus_per_node", MAX_DEVICES_PER_NODE) for n in counts("nodes", MAX_NODES)]
    clusters = [cluster_preset(c).name for c in strings("cluster")] if "cluster" in data else [None]
    for gpu, (g, n), c in itertools.product(gpus, layouts, clusters):
        try:
            make_cluster(gpu, Layout(g, n), c)
        except HorizonError as e:
            raise HorizonError(f"{where}: {gpu} with gpus_per_node {g}, nodes {n}: {e}") from None
    pol = data.get("policy", {})
    if not isinstance(pol, dict):
        raise HorizonError(f"{where}: policy must be a table ([policy] with lists of values)")
    policy = {}
    refuse_unknown(pol, POLICY_FIELDS, where, what="policy key")
    for k, v in pol.items():
        policy[k] = tuple(_as_list(where, f"policy.{k}", v))
    grid = Grid(models=tuple(models), gpus=tuple(gpus), ram_bytes=tuple(ram), links=tuple(links),
                hosts=tuple(hosts), layouts=tuple(layouts), clusters=tuple(clusters), policy=policy)
    if grid.n_simulations > MAX_SWEEP_SIMULATIONS:
        raise HorizonError(
            f"{where}: the grid needs {grid.n_simulations:,} simulations ({len(models)} models x "
            f"{len(gpus)} GPUs x {len(links)} links x {len(hosts)} hosts x {len(layouts) * len(clusters)} "
            f"layouts x {grid.n_policies:,} policies); allowed: up to {MAX_SWEEP_SIMULATIONS:,}: split it into several sweeps")
    return grid


def load_grid(path) -> Grid:
    """Read a TOML grid file (see the module docstring for its keys)."""
    p = Path(path)
    if not p.is_file():
        raise HorizonError(f"grid file {str(p)!r} not found")
    data = read_toml(p)  # every parse failure one line (safe_read.py)
    return parse_grid(data, str(p), p.parent)
