"""The build's output bookkeeping: Out (the output folder, which remembers every file written
through it and removes the ones an earlier build wrote and this one did not, via MANIFEST),
Section (a README section's title, body and headline numbers), log (progress on stderr) and DPI
(the resolution of the figures the sections draw themselves)."""
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from horizon_sim.safe_files import write_atomic

MANIFEST = ".planner-build-files"
"""Lists, one per line, the files the previous build wrote (relative to the output folder)."""
DPI = 100
"""Resolution of the figures the sections draw themselves (optimizer_modes.py, checkpoints.py; the
Gantt and the map use their own ~110-120)."""


class Out:
    """The output folder; remembers every file written through it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.written: list[str] = []

    def path(self, name: str) -> Path:
        if name not in self.written:
            self.written.append(name)
        return self.root / name

    def text(self, name: str, content: str) -> Path:
        return write_atomic(self.path(name), content.encode(), name)  # never half a file on a full disk

    def previous(self) -> list[str]:
        m = self.root / MANIFEST
        return [ln.strip() for ln in m.read_text().splitlines() if ln.strip()] if m.is_file() else []

    def remove_stale(self) -> list[str]:
        """Delete what the previous build wrote and this one did not (call after every output
        is registered). Returns the names deleted."""
        stale = [n for n in self.previous() if n not in self.written and "/" not in n and n != MANIFEST]
        for n in stale:
            (self.root / n).unlink(missing_ok=True)
        return stale

    def write_manifest(self) -> None:
        (self.root / MANIFEST).write_text("".join(f"{n}\n" for n in sorted(self.written)))


def log(msg: str, t0: float | None = None) -> None:
    """One progress line on stderr."""
    tail = f" ({time.perf_counter() - t0:.1f} s)" if t0 is not None else ""
    print(f"[reports] {msg}{tail}", file=sys.stderr, flush=True)


@dataclass
class Section:
    title: str
    body: str
    data: dict = field(default_factory=dict)
    """Headline numbers, for the final summary line and tests."""
