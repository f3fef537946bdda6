"""The README and docs/ stand alone and match the tree: every repository path they name exists
(they are the map a reader follows, and a module move must not leave them pointing nowhere), and
no link leaves the repository."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("horizon_sim", "horizon_exec", "tests", "benchmarks", "docs", "reports")
# `horizon_exec/runtime/ops.py`, `optim/native/adamw.c`, [text](docs/x.md): a path in the tree
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*\w)" % "|".join(TOP))
LINK = re.compile(r"\]\(([^)#\s]+)")
# `runtime/store.py`, `sim/verdict.py`: a file named from inside one of the two packages
FILE = re.compile(r"(?<![\w./-])(\w+(?:/[\w.-]+)+\.(?:py|c|md|toml|json|png|csv))\b")
BASES = (ROOT, ROOT / "horizon_exec", ROOT / "horizon_sim")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_paths_exist(doc):
    text = doc.read_text()
    missing = sorted({p for p in PATH.findall(text) if not (ROOT / p).exists()}
                     | {f for f in FILE.findall(text) if not any((b / f).exists() for b in BASES)})
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_stay_in_the_repository(doc):
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
        assert path.exists(), f"{doc.name} links to a missing file: {target}"
