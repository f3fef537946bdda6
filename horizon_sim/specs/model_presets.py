"""Named model presets, collected from the families (each family's module in specs/families holds
its own, with the config.json each was copied from); their parameter totals are checked against
transformers in tests/test_model_presets.py."""
from horizon_sim.errors import HorizonError
from horizon_sim.specs.families import FAMILIES
from horizon_sim.specs.model import ModelSpec
from horizon_sim.units import closest

PRESETS: dict[str, ModelSpec] = {p["name"]: ModelSpec(family=f.name, **p) for f in FAMILIES.values()
                                 for p in f.presets}


def model_preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise HorizonError(
            f"unknown model {name!r}{closest(name, PRESETS)}; presets: {', '.join(PRESETS)}, "
            "or a path to a config.json") from None
