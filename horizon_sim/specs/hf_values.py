"""Typed reads of one config.json value, each refusing a wrong one in a line that names the key
(shared by the generic reader hf_config.py and the per-family rows of specs/families)."""
import math

from horizon_sim.errors import HorizonError


def as_int(cfg: dict, key: str, where: str, default=None, minimum: int = 1) -> int:
    """cfg[key] as an integer >= minimum; absent (or null with a default): default, and with no
    default the key is required."""
    if key not in cfg or (cfg[key] is None and default is not None):
        if default is None:
            raise HorizonError(f"{where}: required key {key!r} is missing")
        return default
    v = cfg[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise HorizonError(f"{where}: key {key!r} = {v!r} must be an integer")
    if v < minimum:
        raise HorizonError(f"{where}: key {key!r} = {v!r} must be an integer >= {minimum}")
    return v


def as_bool(cfg: dict, key: str, where: str, default: bool) -> bool:
    """cfg[key] as true/false; absent or null: default."""
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise HorizonError(f"{where}: key {key!r} = {v!r} must be true or false")
    return v


def as_float(v, key: str, where: str, minimum: float = 0.0, strict: bool = True) -> float:
    """v (the value of key) as a finite number above minimum (strict) or at least minimum."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < minimum or (strict and v == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise HorizonError(f"{where}: key {key!r} = {v!r} must be a finite number {bound}")
    return float(v)
