"""The specs are spelled once and travel typed: one Layout type holds devices per node x nodes,
a Schedule's meta holds the ModelSpec, Policy and Layout themselves, and only a serializer (a
spec's from_dict) turns a dict back into a spec."""
import ast
from pathlib import Path

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.peer.zero3_builder import build_zero3_schedule
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule import build_eval_schedule, build_schedule
from horizon_sim.specs.layout import Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for pkg in ("horizon_sim", "horizon_exec", "benchmarks") for p in (ROOT / pkg).rglob("*.py"))
LAYOUT_FIELDS = {"devices_per_node", "nodes"}
SPECS = {"ModelSpec", "Policy", "Zero3Policy", "Layout", "ClusterSpec"}
SPEC = ModelSpec(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=160, vocab=512)


def _trees():
    for path in SOURCES:
        yield path.relative_to(ROOT), ast.parse(path.read_text())


def test_only_layout_spells_devices_per_node_and_nodes():
    """No other class has those fields and no function takes both as arguments: each holds or
    takes a Layout (ClusterSpec, ScheduleMeta, Partition, DistContext, the builders...)."""
    found = []
    for rel, tree in _trees():
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef) and n.name != "Layout":
                names = {t.target.id for t in n.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
                if names & LAYOUT_FIELDS:
                    found.append(f"{rel}: class {n.name} has {sorted(names & LAYOUT_FIELDS)}")
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = {a.arg for a in (*n.args.args, *n.args.kwonlyargs)}
                if LAYOUT_FIELDS <= args:
                    found.append(f"{rel}: {n.name}() takes devices_per_node and nodes")
    assert not found, found


def _rebuilds_from_a_spec_dict(call: ast.Call) -> bool:
    """X(**d) where d comes from a spec or a Schedule's meta (x.model, x.policy, x["model"],
    y.to_dict(), ...)."""
    for kw in call.keywords:
        if kw.arg is not None:
            continue
        for n in ast.walk(kw.value):
            if isinstance(n, ast.Attribute) and n.attr in ("model", "policy", "meta", "to_dict"):
                return True
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) \
                    and n.slice.value in ("model", "policy", "zero3", "layout"):
                return True
    return False


def test_no_module_rebuilds_a_spec_from_a_dict():
    """Specs come back from dicts through their from_dict (the serializers), nowhere else."""
    found = [f"{rel}:{n.lineno}" for rel, tree in _trees() for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in SPECS
             and _rebuilds_from_a_spec_dict(n)]
    assert not found, found


@pytest.mark.parametrize("build", ["train", "eval", "peer"])
def test_schedule_meta_holds_the_specs_themselves(build):
    pol, layout = Policy(batch=2, seq=32), Layout(2, 1)
    sched = {"train": lambda: build_schedule(SPEC, pol, layout),
             "eval": lambda: build_eval_schedule(SPEC, pol, layout),
             "peer": lambda: build_zero3_schedule(SPEC, Zero3Policy(batch=2, seq=32))}[build]()
    m = sched.meta
    assert m.model is SPEC and isinstance(m.policy, Policy) and isinstance(m.layout, Layout)
    assert (m.family, m.purpose) == {"train": ("horizon", "train"), "eval": ("horizon", "eval"),
                                     "peer": ("zero3-offload", "train")}[build]
    if build != "peer":
        assert m.policy is pol and m.layout == layout


def test_layout_checks_and_from_dict_errors():
    assert Layout(8, 2).ranks == 16 and str(Layout(8, 2)) == "2 node(s) x 8 device(s)"
    assert Layout(8.0, 1) == Layout(8)  # a whole float from JSON counts
    for bad in (0, -1, 1.5, True, "2", 65):
        with pytest.raises(HorizonError, match=r"devices_per_node=.* must be a whole number from 1 to 64"):
            Layout(bad)
    with pytest.raises(HorizonError, match=r"ModelSpec: unknown field\(s\) colour; allowed: "):
        ModelSpec.from_dict({**SPEC.to_dict(), "colour": "red"})
    with pytest.raises(HorizonError, match="expected a table of Policy fields, got list"):
        Policy.from_dict([1, 2])
    assert ModelSpec.from_dict(SPEC.to_dict()) == SPEC and Policy.from_dict(Policy().to_dict()) == Policy()
