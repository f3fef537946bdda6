"""Every number the planner prices a hardware preset with carries where it comes from
(horizon_sim/specs/preset_sources.py): a datasheet, a measurement, a published figure or
"estimate" with how it was derived. New presets and new numbers cannot slip in uncited."""
from dataclasses import fields, replace

import pytest

from horizon_sim.cli.main import main
from horizon_sim.specs.hardware_presets import DEVICES, HOSTS, LINKS
from horizon_sim.specs.preset_sources import KINDS, PRICED, SOURCES, source_of

TABLES = {"device": DEVICES, "link": LINKS, "host": HOSTS}
NOT_PRICED_HERE = {"name", "default_link", "ram_GiB", "cpu_driven"}
"""Not numbers of the preset: names, the link's name, the RAM (replaced by --ram), a flag."""


@pytest.mark.parametrize("kind", TABLES)
def test_every_priced_number_has_a_source_of_a_known_kind(kind):
    missing, bad = [], []
    for name, preset in TABLES[kind].items():
        for f in PRICED[kind]:
            src = source_of(kind, preset, f)
            if src is None:
                missing.append(f"{name}.{f}")
            elif src.split(":")[0] not in KINDS or len(src.split(":", 1)[1].strip()) < 10:
                bad.append(f"{name}.{f}: {src[:40]!r}")
    assert not missing, f"numbers without a source: {missing}"
    assert not bad, f"sources that do not say their kind and where: {bad}"


@pytest.mark.parametrize("kind", TABLES)
def test_the_other_numbers_are_left_at_their_derived_defaults(kind):
    """A number outside PRICED set on a preset would be priced without a source."""
    for name, preset in TABLES[kind].items():
        for f in fields(preset):
            if f.name in PRICED[kind] or f.name in NOT_PRICED_HERE:
                continue
            assert getattr(preset, f.name) == f.default, f"{kind} {name}.{f.name} is set but has no source entry"


def test_no_entry_names_a_preset_or_number_that_does_not_exist():
    for key, entries in SOURCES.items():
        kind, name = key.split(":")
        assert name in TABLES[kind], key
        assert set(entries) <= set(PRICED[kind]), (key, set(entries) - set(PRICED[kind]))


def test_a_changed_number_loses_the_default_source():
    """Control: a preset whose efficiency is set away from the default, with no entry of its own,
    has no source (so the first test would catch it)."""
    h = DEVICES["h100-sxm"]
    assert source_of("device", h, "matmul_efficiency").startswith("estimate:")
    assert source_of("device", replace(h, matmul_efficiency=0.8), "matmul_efficiency") is None


def test_plan_sources_prints_each_number_with_its_source(capsys):
    assert main(["plan", "--gpu", "gh200", "--sources"]) == 0
    out = capsys.readouterr().out
    assert "device gh200" in out and "host grace" in out and "link nvlink-c2c" in out
    assert "adam_Gparams_per_s = 10.4" in out and "published: DeepSpeed's CPU Adam" in out
    assert "matmul_efficiency = 0.7" in out and "estimate:" in out
    assert main(["plan", "--hardware", "machine.toml", "--sources"]) == 2
    assert "--sources lists the presets' sources" in capsys.readouterr().err
