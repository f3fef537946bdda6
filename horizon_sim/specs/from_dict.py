"""A frozen spec from the plain dict its to_dict() wrote (JSON, TOML, a subprocess's request):
the one place a spec is rebuilt from a dict, so a field the spec does not have is a one-line
error naming it instead of a TypeError from the constructor."""
from dataclasses import fields

from horizon_sim.errors import HorizonError


def spec_from_dict(cls, d, what: str = ""):
    where = f"{what or cls.__name__}: "
    if not isinstance(d, dict):
        raise HorizonError(f"{where}expected a table of {cls.__name__} fields, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    if unknown := sorted(set(d) - known):
        raise HorizonError(f"{where}unknown field(s) {', '.join(map(str, unknown))}; "
                           f"allowed: {', '.join(sorted(known))}")
    return cls(**d)
