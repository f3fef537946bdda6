"""Byte sizes: parsing user input ("1.5TB", "1024GiB", "512G") and printing sizes."""
import difflib
import re

from horizon_sim.errors import HorizonError

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4
KB, MB, GB, TB = 1000, 1000**2, 1000**3, 1000**4

# Bare "G"/"T" mean binary units, as RAM is sold and as `free -g` prints; "GB" is decimal.
_UNITS = {
    "": 1, "b": 1,
    "k": KiB, "kib": KiB, "kb": KB,
    "m": MiB, "mib": MiB, "mb": MB,
    "g": GiB, "gib": GiB, "gb": GB,
    "t": TiB, "tib": TiB, "tb": TB,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float, what: str = "size") -> int:
    """Bytes in `text`: '1TB', '1.5TB', '1024GiB', '512G', or a plain byte count. Must be > 0."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        n = int(text)
    else:
        m = _SIZE.match(str(text))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise HorizonError(
                f"{what} {text!r} is not a size; use a number with a unit like 512GiB, 1.5TB, 512G")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise HorizonError(f"{what} {text!r} must be greater than zero")
    return n


def fmt_bytes(n: float) -> str:
    """Human size in binary units: 1.50 TiB, 37.2 GiB, 512 MiB."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def closest(name: str, choices) -> str:
    """' (did you mean X?)' for the nearest known name, or '' when none is close."""
    hit = difflib.get_close_matches(name.lower(), list(choices), n=1, cutoff=0.5)
    return f" (did you mean {hit[0]!r}?)" if hit else ""


def refuse_unknown(keys, allowed, where: str, label: str = "allowed", table: str | None = None,
                   what: str = "key") -> None:
    """HorizonError for the first of `keys` not in `allowed`: "<where>: unknown key 'k' [in
    [table]] (did you mean ...?); <label>: a, b, c" (the tables of a file read from TOML or JSON)."""
    for key in keys:
        if key not in allowed:
            in_table = f" in [{table}]" if table else ""
            raise HorizonError(f"{where}: unknown {what} {key!r}{in_table}{closest(key, allowed)}; "
                               f"{label}: {', '.join(allowed)}")
