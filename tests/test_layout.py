"""The executor's groups depend on each other one way (docs/architecture.md, "Layout"): the
bottom (model, device, optim, dist, and the shared errors, dtypes and procfs modules) imports none of
the groups above it, and no import cycle joins two groups."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "horizon_exec"
GROUPS = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists())
BOTTOM = {"model", "device", "optim", "dist"}


def _edges() -> dict[str, set[str]]:
    out = {g: set() for g in GROUPS}
    for g in GROUPS:
        for f in (PKG / g).rglob("*.py"):
            for n in ast.walk(ast.parse(f.read_text())):
                names = []
                if isinstance(n, ast.ImportFrom) and n.module:
                    names = [n.module, *(f"{n.module}.{a.name}" for a in n.names)]
                elif isinstance(n, ast.Import):
                    names = [a.name for a in n.names]
                for name in names:
                    q = name.split(".")
                    if q[0] == "horizon_exec" and len(q) > 1 and q[1] in GROUPS and q[1] != g:
                        out[g].add(q[1])
    return out


def test_the_groups_are_the_documented_ones():
    assert set(GROUPS) == {"runtime", "device", "model", "optim", "dist", "train", "data", "checkpoints",
                           "measure", "cli"}


def test_the_bottom_imports_no_group_above_it():
    edges = _edges()
    for g in BOTTOM:
        assert edges[g] <= BOTTOM, (g, edges[g] - BOTTOM)


def test_no_import_cycle_between_groups():
    edges = _edges()

    def reach(a):
        seen, todo = set(), [a]
        while todo:
            for b in edges[todo.pop()]:
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    cycles = [g for g in GROUPS if g in reach(g)]
    assert not cycles, {g: sorted(edges[g]) for g in cycles}
