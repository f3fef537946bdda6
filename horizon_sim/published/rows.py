"""One published figure and the setup it was measured on, read from measurements.toml.

A row is checked when it is read, so a typo in the data file is a one-line error naming the row
and the field, not a wrong comparison later."""
from dataclasses import dataclass, field, fields
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.published.quantity import MEMORY_FIGURES, QUANTITIES
from horizon_sim.safe_read import read_toml
from horizon_sim.schedule.op import Family

MEASUREMENTS = Path(__file__).with_name("measurements.toml")
SYSTEMS = tuple(f.value for f in Family)
"""What the source ran: a RAM-centric trainer of Horizon's design (planned with `horizon plan`),
DeepSpeed ZeRO-3 with parameters and optimizer offloaded to the CPU (the planner's peer,
`plan --compare zero3-offload`) or DeepSpeed ZeRO-2 with the optimizer offloaded and the
parameters on the GPU (`plan --compare zero2-offload`)."""


@dataclass(frozen=True)
class PublishedRow:
    id: str
    source: str
    """The publication, short: rows of one source count once towards 'independent sources'."""
    cite: str
    """Where the number is: repository + file + commit and figure/table/line, or a URL."""
    setup: str
    """The setup as the source describes it, in its own terms."""
    system: str
    plan: str
    """`horizon plan` flags that put the planner on that setup (model, GPU, host, batch, ...)."""
    quantity: str
    value: float
    model: dict = field(default_factory=dict)
    """ModelSpec fields, where no preset has the source's model (then --model is not in plan)."""
    unreachable: str = ""
    """Why the planner cannot model this row (listed with the reason, never dropped)."""
    assumed: str = ""
    """The parts of the setup the source does not state and the row assumes, with where the
    assumption comes from (the row is marked * wherever it is printed)."""
    note: str = ""
    held_out: bool = False
    """Entered to test the planner and never looked at while a mechanism was built or checked
    (docs/published.md, "Held out"): its medians are reported apart from the others'."""
    entered: str = ""
    """A held-out row's error when it was entered, with the planner's commit, so later changes
    show against it."""
    memory_figure: str = ""
    """A device-memory row's figure, as its source measured it (quantity.MEMORY_FIGURES):
    'allocated', 'reserved', 'nvidia-smi' or 'unknown'; the planner reads the same figure."""


_REQUIRED = ("id", "source", "cite", "setup", "system", "plan", "quantity", "value")
_KNOWN = {f.name for f in fields(PublishedRow)}


def _row(d: dict, i: int, where: str) -> PublishedRow:
    name = d.get("id", f"row {i + 1}")
    unknown = sorted(set(d) - _KNOWN)
    if unknown:
        raise HorizonError(f"{where}: {name}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KNOWN))}")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise HorizonError(f"{where}: {name}: missing {', '.join(missing)}")
    if d["system"] not in SYSTEMS:
        raise HorizonError(f"{where}: {name}: system {d['system']!r}; allowed: {', '.join(SYSTEMS)}")
    if d["quantity"] not in QUANTITIES:
        raise HorizonError(f"{where}: {name}: quantity {d['quantity']!r}; allowed: {', '.join(QUANTITIES)}")
    v = d["value"]
    if isinstance(v, bool):
        v = float(v)
    elif not isinstance(v, (int, float)) or not v > 0:
        raise HorizonError(f"{where}: {name}: value {v!r} must be a positive number (or true/false for fits)")
    device = QUANTITIES[d["quantity"]].group == "device memory"
    fig = d.get("memory_figure", "")
    if device and fig not in MEMORY_FIGURES:
        raise HorizonError(f"{where}: {name}: a device-memory row says which figure its source reports: memory_figure "
                           f"{fig!r}; allowed: {', '.join(MEMORY_FIGURES)}")
    if not device and fig:
        raise HorizonError(f"{where}: {name}: memory_figure is for device-memory rows, not {d['quantity']!r}")
    if not isinstance(d.get("held_out", False), bool):
        raise HorizonError(f"{where}: {name}: held_out {d['held_out']!r} must be true or false")
    if d["quantity"] == "fits" and v not in (0.0, 1.0):
        raise HorizonError(f"{where}: {name}: a fits row's value is true or false, not {v!r}")
    if "--model" in d["plan"].split() and d.get("model"):
        raise HorizonError(f"{where}: {name}: give the model once, as --model in plan or as a model table")
    if "model" in d:
        from horizon_sim.specs.model import ModelSpec
        known = {f.name for f in fields(ModelSpec)}
        bad = sorted(set(d["model"]) - known) if isinstance(d["model"], dict) else ["(not a table)"]
        if bad:
            raise HorizonError(f"{where}: {name}: model field(s) {', '.join(bad)} unknown; a model table takes "
                               f"ModelSpec's fields: {', '.join(sorted(known))}")
    return PublishedRow(**{**d, "value": float(v)})


def load_rows(path: str | Path = MEASUREMENTS) -> list[PublishedRow]:
    """Every row of a measurements file ([[row]] tables), checked; ids are unique."""
    where = str(path)
    data = read_toml(path, where)  # every parse failure one line (safe_read.py)
    raw = data.get("row")
    if not isinstance(raw, list) or not raw:
        raise HorizonError(f"{where}: no [[row]] tables")
    rows = [_row(d, i, where) for i, d in enumerate(raw)]
    seen: set[str] = set()
    for r in rows:
        if r.id in seen:
            raise HorizonError(f"{where}: row id {r.id!r} appears twice")
        seen.add(r.id)
    return rows
