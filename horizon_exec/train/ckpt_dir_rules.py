"""What a --ckpt-dir may hold, and what may lie inside it (issue 43, items 8d and 8f), checked
before the first step by outputs.prepare_outputs.

The checkpointer owns some names of its folder: the step folders `step-N` (replaced when a step
is written again, removed by --keep-ckpts and --overwrite-ckpt), `latest` (replaced at every
checkpoint), `.lock`, the hidden temporaries of a killed save (`.step-N.<host>-<pid>.*`, removed
by the next save), node-J folders of a run over several nodes (each one such a folder), and
`lost+found` (a file system's own, where the folder is a mount point). Besides these, the run's
own --log-file, --save-hf and --report-dir may sit in the folder (a log beside its checkpoints is
common), and the folder `report` (REPORT: where a run writes its predicted-vs-measured report by
default, cli/train_plan.py; a run without one, or one given --report-dir, leaves it as it is).

    refuse_risky_entries(folder, own)       a name the checkpointer would replace or remove
                                            holds something else: refused, even with --overwrite-ckpt
    refuse_foreign_entries(folder, own, ..) anything else (a user's files, `/`, `/etc`): refused
                                            unless --overwrite-ckpt, which then writes beside them
                                            (it only ever removes step folders)
    refuse_inside_checkpoints(flag, p, ck)  --log-file / --save-hf inside a step folder, `latest`,
                                            `.lock` or a temporary: the checkpointer would remove
                                            or replace it

A resumed run in a folder that already holds checkpoints is not asked about other files: the
folder is a checkpoint folder already (a fresh run made it), and nothing but step folders is
removed from it.
"""
import os
import re
from pathlib import Path, PurePath

from horizon_sim.errors import HorizonError

_STEP = re.compile(r"step-[0-9]+")
_NODE = re.compile(r"node-[0-9]+")
LATEST, LOCK = "latest", ".lock"                                    # ckpt.LATEST, ckpt_lock.LOCK
REPORT = "report"   # the run's predicted-vs-measured report, by default (cli/train_plan.py)
CHECKPOINT_FILES = frozenset({"state.safetensors", "trainer.json", "SHA256SUMS"})  # ckpt.STATE, META, SUMS
# fileio's temporaries (`.<name>.<host>-<pid>.<x>.tmp` or `.old`) and _folder's write probe
_LEFTOVER = re.compile(r"\.(?:step-[0-9]+|latest)\.[A-Za-z0-9-]+-[0-9]+\.(?:[^.]+\.tmp|old)|\.horizon-probe-.*")


def relative_to(path: Path, folder: Path) -> PurePath | None:
    """path under folder (symbolic links resolved, missing parts taken as written), else None."""
    p, f = path.resolve(), folder.resolve()
    return p.relative_to(f) if p == f or p.is_relative_to(f) else None


def own_names(folder: Path, outputs) -> set[str]:
    """The names directly in `folder` that the run's other outputs (--save-hf, --log-file,
    --report-dir: paths or None) are, or lie under."""
    names = set()
    for p in outputs:
        rel = relative_to(Path(p), folder) if p else None
        if rel is not None and rel.parts:
            names.add(rel.parts[0])
    return names


def _is_own(name: str, own: set[str]) -> bool:
    # an output's own name, or what its writer puts beside it (--save-hf's `.<name>.lock`, its staging folder)
    return name in own or any(name.startswith(f".{o}.") for o in own)


def _names_a_step(latest: Path) -> bool:
    """`latest` is a file holding a step folder's name, as the checkpointer writes it."""
    if latest.is_symlink() or not latest.is_file():   # a FIFO is not opened (it would block)
        return False
    try:
        with open(latest, "rb") as f:
            raw = f.read(256)
    except OSError:
        return False
    return bool(_STEP.fullmatch(raw.decode("ascii", "replace").strip()))


def _holds_only_a_checkpoint(step: Path) -> bool:
    if step.is_symlink() or not step.is_dir():
        return False
    try:
        return set(os.listdir(step)) <= CHECKPOINT_FILES
    except OSError:   # cannot tell: not known to be the checkpointer's
        return False


def _entries(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []   # _folder has shown it can be written; a folder that cannot be listed holds nothing known


def refuse_risky_entries(folder: Path, own: set[str]) -> None:
    """HorizonError when an entry has a name the checkpointer replaces or removes but is not
    its own: a step-N that is not a checkpoint folder (a file, a link, a folder with other
    files), a `latest` naming no step folder in a folder without checkpoints. Not even
    --overwrite-ckpt lets a run lose them."""
    names = _entries(folder)
    has_steps = any(_STEP.fullmatch(n) and (folder / n).is_dir() for n in names)
    for n in names:
        if _is_own(n, own):
            continue
        if _STEP.fullmatch(n) and not _holds_only_a_checkpoint(folder / n):
            raise HorizonError(f"--ckpt-dir {str(folder)!r}: {n!r} is named like a checkpoint folder but holds "
                               "other things; checkpoint folders are replaced and removed (--keep-ckpts, "
                               "--overwrite-ckpt), so move it away or give another --ckpt-dir")
        if n == LATEST and not (folder / n).is_dir() and not has_steps and not _names_a_step(folder / n):
            raise HorizonError(f"--ckpt-dir {str(folder)!r}: its {LATEST!r} names no checkpoint, and every "
                               "checkpoint replaces that file; move it away or give another --ckpt-dir")


def foreign_entries(folder: Path, own: set[str]) -> list[str]:
    """The entries of folder that are neither the checkpointer's nor the run's own outputs."""
    out = []
    for n in _entries(folder):
        p = folder / n
        if _STEP.fullmatch(n) or n in (LATEST, LOCK) or _LEFTOVER.fullmatch(n) or _is_own(n, own):
            continue
        if (_NODE.fullmatch(n) or n in ("lost+found", REPORT)) and p.is_dir() and not p.is_symlink():
            continue
        out.append(n)
    return out


def refuse_foreign_entries(folder: Path, own: set[str], fresh: bool, overwrite: bool) -> None:
    """HorizonError when folder holds anything but checkpoints and the run's own outputs
    (module docstring), unless --overwrite-ckpt (a fresh run only) says to write beside it."""
    if overwrite:
        return
    other = foreign_entries(folder, own)
    if not other:
        return
    what = (f"{len(other)} entries that are not checkpoints (e.g. {other[0]!r})" if len(other) > 1 else
            f"{other[0]!r}, which is not a checkpoint")
    how = ("give a new or empty folder, or add --overwrite-ckpt to write the checkpoints beside them "
           "(only step folders are ever removed)" if fresh else "give a new or empty folder for the checkpoints")
    raise HorizonError(f"--ckpt-dir {str(folder)!r} holds {what}; {how}")


def refuse_inside_checkpoints(flag: str, path: Path, ckpt_dir: Path) -> None:
    """HorizonError when `path` (--log-file, --save-hf, --report-dir) lies among the checkpointer's own
    files of ckpt_dir: it would be replaced or removed with them."""
    rel = relative_to(path, ckpt_dir)
    if rel is None or not rel.parts:
        return
    parts = rel.parts
    if _NODE.fullmatch(parts[0]) and len(parts) > 1:   # a node's folder holds the same names
        parts = parts[1:]
    n = parts[0]
    why = ("a checkpoint folder, replaced and removed as checkpoints are written" if _STEP.fullmatch(n) else
           "the file naming the newest checkpoint, replaced at every checkpoint" if n == LATEST else
           "the folder's lock file" if n == LOCK else
           "a node's checkpoint folder" if _NODE.fullmatch(n) else
           "a temporary of the checkpointer, removed by the next save" if _LEFTOVER.fullmatch(n) else "")
    if why:
        raise HorizonError(f"{flag} {str(path)!r} lies among the files the checkpointer owns in --ckpt-dir "
                           f"{str(ckpt_dir)!r} ({n!r}: {why}); put it beside the checkpoints or elsewhere")
