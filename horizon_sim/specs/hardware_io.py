"""HardwareSpec to and from a TOML file: a top-level `name` and three flat tables.

    name = "h200 / pcie-gen5 / default host, 1.36 TiB RAM"
    [device]
    name = "h200"
    hbm_GiB = 140.4013671875
    ...
    [link]
    ...
    [host]
    ...

An optional [cluster] table (ClusterSpec: devices per node, nodes, fabric and network) is
written only for a multi-device machine; without it the machine is one device on one node.
Read with the standard library's tomllib (safe_read.read_toml); written here (flat tables of strings, numbers,
booleans and arrays need no TOML library). Measured tables (a device's GEMM throughput by
shape, its per-op overheads) are arrays of rows, one row per line:

    gemm_TFLOPs = [
        ["bf16", "nt", 512.0, 512.0, 512.0, 0.21],
        ...
    ] Every problem with a file is a one-line HorizonError that
names the file and the key.
"""
import math
from dataclasses import MISSING, fields
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.safe_read import read_toml_file
from horizon_sim.specs.cluster import SINGLE, ClusterSpec
from horizon_sim.specs.hardware import DeviceSpec, HardwareSpec, HostSpec, LinkSpec
from horizon_sim.specs.layout import Layout
from horizon_sim.units import refuse_unknown

TABLES = {"device": DeviceSpec, "link": LinkSpec, "host": HostSpec}
OPTIONAL_TABLES = {"cluster": ClusterSpec}
TOP_LEVEL_KEYS = ("name", *TABLES, *OPTIONAL_TABLES)
LAYOUT_KEYS = tuple(f.name for f in fields(Layout))
"""[cluster] spells its Layout's fields flat, beside the fabric and network it describes."""


def _table_items(part) -> list[tuple[str, object]]:
    """(key, value) of a table as the file writes it: a cluster's layout flattened."""
    items = [(f.name, getattr(part, f.name)) for f in fields(part)]
    if isinstance(part, ClusterSpec):
        items = [(k, getattr(part.layout, k)) for k in LAYOUT_KEYS] + [(k, v) for k, v in items if k != "layout"]
    return items


def _table_keys(cls) -> list[tuple[str, bool]]:
    """(key, required) a table of `cls` may hold."""
    keys = [(f.name, f.default is MISSING and f.default_factory is MISSING) for f in fields(cls)]
    if cls is ClusterSpec:
        keys = [(k, False) for k in LAYOUT_KEYS] + [kr for kr in keys if kr[0] != "layout"]
    return keys


def _table_spec(cls, body: dict):
    if cls is ClusterSpec:
        body = dict(body)
        try:
            layout = Layout(**{k: body.pop(k) for k in LAYOUT_KEYS if k in body})
        except HorizonError as e:
            raise HorizonError(f"cluster {e}") from None
        return ClusterSpec(layout=layout, **body)
    return cls(**body)


def toml_value(v) -> str:
    """`v` (bool, int, float, str, list) as a TOML value: what write_hardware writes, and what a
    test writing its own TOML must write to be read back the same."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise HorizonError(f"cannot write non-finite number {v!r} to TOML")
        return repr(v)  # shortest round-trip form; '1e-05' and '140.4' are both valid TOML
    if isinstance(v, str):
        out = []
        for ch in v:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04X}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise HorizonError(f"cannot write {type(v).__name__} value {v!r} to TOML")


def _toml_line(key: str, v) -> str:
    """`key = value`; a table (a tuple of rows) is written one row per line."""
    if isinstance(v, tuple) and v and all(isinstance(r, tuple) for r in v):
        return f"{key} = [\n" + "".join(f"    {toml_value(r)},\n" for r in v) + "]"
    return f"{key} = {toml_value(v)}"


def hardware_to_toml(hw: HardwareSpec) -> str:
    lines = ["# Horizon hardware spec. Units are in the key names: GiB = 2**30 bytes,",
             "# GBps = 1e9 bytes/s, TFLOPs = 1e12 FLOP/s, us = microseconds.",
             f"name = {toml_value(hw.name)}"]
    for table in (*TABLES, *(["cluster"] if hw.cluster != SINGLE else [])):
        part = getattr(hw, table)
        lines += ["", f"[{table}]"]
        lines += [_toml_line(k, v) for k, v in _table_items(part)]
    return "\n".join(lines) + "\n"


def save_hardware(hw: HardwareSpec, path) -> None:
    """Write `hw` to `path` as TOML (parent folders must exist)."""
    if not isinstance(hw, HardwareSpec):
        raise HorizonError(f"save_hardware needs a HardwareSpec, got {type(hw).__name__}")
    try:
        Path(path).write_text(hardware_to_toml(hw), encoding="utf-8")
    except OSError as e:
        raise HorizonError(f"hardware file {str(path)!r}: cannot write: {e.strerror or e}") from None


def hardware_from_dict(data: dict, where: str = "hardware") -> HardwareSpec:
    """A HardwareSpec from {name, device: {...}, link: {...}, host: {...}}; errors start with
    `where` (a file name, usually)."""
    if not isinstance(data, dict):
        raise HorizonError(f"{where}: expected a table with [device], [link] and [host]")
    refuse_unknown(data, TOP_LEVEL_KEYS, where, "allowed at top level")
    parts = {}
    for table, cls in {**TABLES, **OPTIONAL_TABLES}.items():
        if table not in data:
            if table in OPTIONAL_TABLES:
                continue
            raise HorizonError(f"{where}: missing table [{table}]")
        body = data[table]
        if not isinstance(body, dict):
            raise HorizonError(f"{where}: {table} = {body!r} must be a table [{table}]")
        keys = _table_keys(cls)
        known = [k for k, _ in keys]
        refuse_unknown(body, known, where, table=table)
        for key, required in keys:
            if key not in body and required:
                raise HorizonError(f"{where}: [{table}] is missing key {key!r}")
        try:
            parts[table] = _table_spec(cls, body)  # type and range checks live in __post_init__
        except HorizonError as e:
            raise HorizonError(f"{where}: {e}") from None
    name = data.get("name", "")
    try:
        return HardwareSpec(name=name, **parts)
    except HorizonError as e:
        raise HorizonError(f"{where}: {e}") from None


def load_hardware(path) -> HardwareSpec:
    """Read a HardwareSpec written by save_hardware (or by hand)."""
    where = f"hardware file {str(path)!r}"
    return hardware_from_dict(read_toml_file(path, where), where)  # every failure one line (safe_read.py)
