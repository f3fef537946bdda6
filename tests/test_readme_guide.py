"""The README is a user's guide (issue 39, item 6): its first screen answers "will this fit my
box, how fast" with a `horizon plan` a user can copy, and "train it on my GPU" with the tune ->
job -> train path; the Results table gives one figure per cell (history goes to
docs/results.md). The commands it shows there are the real CLI's: each parses."""
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIRST = README.splitlines()[:40]
MAX_CELL_CHARS = 300


def _commands(lines) -> list[list[str]]:
    """The `.venv/bin/horizon ...` commands of these lines ($ prompts, continuations, comments off)."""
    text = "\n".join(lines).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.removeprefix("$ ").strip()
        if line.startswith(".venv/bin/horizon "):
            out.append(shlex.split(line.split("  #")[0])[1:])
    return out


def test_the_first_screen_plans_and_shows_tune_job_train():
    cmds = _commands(FIRST)
    verbs = [c[0] for c in cmds]
    assert "plan" in verbs, FIRST
    tune = next(c for c in cmds if c[0] == "tune")
    train = next(c for c in cmds if c[0] == "train")
    job = tune[tune.index("--save-job") + 1]
    assert train[train.index("--job") + 1] == job


@pytest.mark.parametrize("verb", ["plan", "tune", "train"])
def test_the_first_screens_commands_parse(verb):
    """Each command of the first screen is accepted by the CLI's parser as written."""
    from horizon_sim.cli.main import _parser
    for c in (c for c in _commands(FIRST) if c[0] == verb):
        _parser().parse_args(c)   # SystemExit (exit 2) on an unknown flag or bad value


def test_no_results_cell_is_a_lab_notebook():
    table = README[README.index("## Results"):]
    table = table[:table.index("\n## ")]
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| ---")]
    assert len(rows) > 5
    for r in rows:
        for cell in re.split(r"(?<!\\)\|", r.strip().strip("|")):
            assert len(cell.strip()) <= MAX_CELL_CHARS, cell[:120]
    assert "docs/results.md" in table and (ROOT / "docs" / "results.md").is_file()
