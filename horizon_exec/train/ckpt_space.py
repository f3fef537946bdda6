"""The most disk space a --ckpt-dir takes during a run, beyond what it holds when the run starts
(issue 43, item 4): checked up front (save.check_space_for) so that a run is refused at start
instead of failing at its second checkpoint.

A save writes the new checkpoint beside the ones kept, publishes it, and only then removes the
oldest beyond --keep-ckpts (ckpt._save), so --keep-ckpts K holds K + 1 checkpoints at once
once the run has written K; --keep-ckpts 0 keeps every one. A resumed run counts the
checkpoints already in the folder as used space (the free space the file system reports
excludes them) and the ones its saves will prune as space given back, exactly as ckpt._save
prunes: complete checkpoints (trainer.json) up to the step just written, oldest first.

    need = ckpt_dir_need(each_bytes=2 << 20, existing={}, start=0, steps=10, save_every=1, keep=2)
    need.extra_bytes == 3 * (2 << 20); need.at_once == 3
"""
import os
import re
from dataclasses import dataclass
from pathlib import Path

from horizon_sim.units import fmt_bytes

_STEP = re.compile(r"step-([0-9]+)")   # ckpt.py's step folders
_META = "trainer.json"                 # ckpt.META: a complete checkpoint has it (ckpt.list_checkpoints)


@dataclass(frozen=True)
class Existing:
    """A step folder already in the --ckpt-dir."""
    nbytes: int
    complete: bool
    """Holds trainer.json: the prune counts it (ckpt.list_checkpoints); an incomplete one stays."""


@dataclass(frozen=True)
class CkptDirNeed:
    extra_bytes: int
    """Bytes beyond what the folder's checkpoints take now, at the run's peak."""
    at_once: int
    """Checkpoints in the folder at that peak, the one being written included."""
    there_bytes: int
    """Bytes the folder's checkpoints take now (used space already)."""
    each_bytes: int

    def detail(self) -> str:
        """What the figure is made of, for the refusal line."""
        s = f"{self.at_once} checkpoint{'s' if self.at_once != 1 else ''} of {fmt_bytes(self.each_bytes)} at once"
        if self.there_bytes:
            s += f", less the {fmt_bytes(self.there_bytes)} of those already there"
        return s


def existing_checkpoints(folder: Path) -> dict[int, Existing]:
    """step -> size and completeness of folder's step folders (a folder unreadable counts 0 B)."""
    found = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for e in entries:
        m = _STEP.fullmatch(e.name)
        if not m or not e.is_dir(follow_symlinks=False):
            continue
        nbytes, complete = 0, False
        try:
            for f in os.scandir(e.path):
                if f.is_file(follow_symlinks=False):
                    nbytes += f.stat(follow_symlinks=False).st_size
                    complete = complete or f.name == _META
        except OSError:
            pass
        found[int(m.group(1))] = Existing(nbytes, complete)
    return found


def save_steps(start: int, steps: int, save_every: int):
    """The steps after which the run saves (TrainLoop._steps): every save_every-th, and the
    last; a run with nothing left to train still counts one save at `start` (a resumed run
    that owes its final eval may write its checkpoint again)."""
    if steps <= start:
        yield start
        return
    s = (start // save_every + 1) * save_every if save_every else steps
    while s < steps:
        yield s
        s += save_every
    yield steps


def _count_saves(start: int, steps: int, save_every: int) -> int:
    """len(list(save_steps(...))) without walking a million steps."""
    if steps <= start:
        return 1
    return (max(0, (steps - 1) // save_every - start // save_every) if save_every else 0) + 1


def ckpt_dir_need(each_bytes: int, existing: dict[int, Existing], start: int, steps: int, save_every: int,
                  keep: int) -> CkptDirNeed:
    """The peak of the folder's checkpoints during the run, as bytes beyond what `existing`
    (step -> Existing) takes now. each_bytes: one checkpoint of this run (an upper bound);
    start: the step the run starts from (0, or the resumed checkpoint's)."""
    present = {s: (e.nbytes, e.complete, False) for s, e in existing.items()}   # step -> (bytes, complete, mine)
    there = sum(b for b, _, _ in present.values())
    if keep == 0:
        # nothing is pruned: every save adds one. (A save over a step folder that is already there,
        # one of an abandoned trajectory, replaces it once published; not counted: a slight overestimate.)
        n = _count_saves(start, steps, save_every)
        return CkptDirNeed(n * each_bytes, len(present) + n, there, each_bytes)
    peak, at_once = there, len(present)
    for s in save_steps(start, steps, save_every):
        now = sum(b for b, _, _ in present.values()) + each_bytes   # the new one written beside the rest
        if now > peak:
            peak, at_once = now, len(present) + 1
        if sum(mine for _, _, mine in present.values()) == keep and not any(
                complete and not mine for _, complete, mine in present.values()):
            break   # only this run's `keep` are pruned from now on: no later save holds more
        present[s] = (each_bytes, True, True)   # published (an older folder of that step is replaced)
        prunable = sorted(q for q, (_, complete, _) in present.items() if complete and q <= s)
        for q in prunable[:-keep]:
            del present[q]
    return CkptDirNeed(max(0, peak - there), at_once, there, each_bytes)
