"""Training checkpoints for exact resume.

A checkpoint is a folder `<ckpt_dir>/step-XXXXXXXX/` holding
    state.safetensors   the host store: fp32 master weights, Adam moments (m | v per unit),
                        the per-unit Adam step counters, the gradient norms, and, when a
                        pipelined update is pending, the previous step's host gradients
    trainer.json        everything else: step, pending flag and its lr, the model and policy
                        it was written for, optimizer hyper-parameters, and the training
                        loop's own state (data loader position, schedule settings, ...)
    SHA256SUMS          one line per file, `sha256sum -c` format
The working copy (bf16) is not stored: it is the master cast, recomputed on load. The
folder is written under a temporary name, fsynced and renamed into place; then the text file
`<ckpt_dir>/latest` is replaced atomically to name it, and checkpoints beyond `keep` are
removed. A failure mid-write leaves the previous checkpoint and `latest` untouched (a
process killed mid-write leaves a hidden temporary folder, removed by the next save).

Resuming from a checkpoint into a trainer built with the same model and policy gives a run
whose next steps equal the uninterrupted run bit for bit (fp32): every number a step reads
is restored exactly.
"""
import json
import re
import shutil
from pathlib import Path

from horizon_exec.fileio import (atomic_write_text, publish_dir, sha256_file, staging_dir,
                                 write_safetensors, write_text)
from horizon_sim.errors import HorizonError

FORMAT = 1
STATE, META, SUMS, LATEST = "state.safetensors", "trainer.json", "SHA256SUMS", "latest"
_STEP_DIR = re.compile(r"step-(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _state_items(trainer):
    """(name, tensor) of everything a resumed step reads from the host store."""
    items = []
    for name, t in trainer.store.t.items():
        kind = name.partition(".")[0]
        if kind == "wc" or (kind == "hgrad" and not trainer.pending):
            continue
        items.append((name, t))
    items += [(f"steps.{u}", s) for u, s in trainer.store.steps.items()]
    return items


def save_checkpoint(ckpt_dir, trainer, step: int, loop_state: dict | None = None, keep: int = 2) -> Path:
    """Write checkpoint `step` (optimizer steps done) under ckpt_dir; returns its folder.
    Does not flush a pending pipelined update: the pending gradients are saved instead, so
    the run's own overlap is not disturbed."""
    trainer._check_usable()
    root = Path(ckpt_dir)
    final = root / step_dir_name(step)
    a = trainer.runner.adamw
    meta = {
        "format": FORMAT,
        "step": step,
        "trainer": {"steps_done": trainer.steps_done, "pending": trainer.pending,
                    "pending_lr": trainer.pending_lr, "lr": trainer.lr},
        "model": trainer.model.to_dict(),
        "policy": trainer.policy.to_dict(),
        "optimizer": {"betas": list(a.betas), "eps": a.eps, "weight_decay": a.weight_decay},
        "loop": loop_state or {},
    }
    if root.is_dir():  # leftovers of a run killed mid-write (hidden temporary folders)
        for p in root.glob(".step-*"):
            if p.is_dir() and (p.name.endswith(".tmp") or ".old-" in p.name):
                shutil.rmtree(p, ignore_errors=True)
    with staging_dir(final) as tmp:
        sums = {STATE: write_safetensors(tmp / STATE, [(n, t, None) for n, t in _state_items(trainer)],
                                         {"format": "horizon-ckpt", "step": step})}
        sums[META] = write_text(tmp / META, json.dumps(meta, indent=2) + "\n")
        write_text(tmp / SUMS, "".join(f"{h}  {n}\n" for n, h in sums.items()))
        publish_dir(tmp, final)
    atomic_write_text(root / LATEST, final.name + "\n")
    if keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_dir) -> list[Path]:
    """Complete checkpoint folders (they have trainer.json), oldest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_DIR.match(p.name)) and (p / META).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(ckpt_dir) -> Path | None:
    """The folder `latest` names, else the highest complete step folder, else None."""
    root = Path(ckpt_dir)
    ptr = root / LATEST
    if ptr.is_file():
        p = root / ptr.read_text().strip()
        if (p / META).is_file():
            return p
    found = list_checkpoints(root)
    return found[-1] if found else None


def resolve(path) -> Path:
    """A checkpoint folder, or a ckpt_dir (its latest checkpoint)."""
    p = Path(path)
    if (p / META).is_file():
        return p
    latest = latest_checkpoint(p)
    if latest is None:
        raise HorizonError(f"no checkpoint in {str(p)!r} (want a step-N folder with {META}, or a "
                           f"checkpoint folder holding one)")
    return latest


def verify_checkpoint(path) -> None:
    """Recompute every file's SHA-256 against SHA256SUMS; HorizonError on a mismatch."""
    p = Path(path)
    try:
        lines = (p / SUMS).read_text().splitlines()
    except OSError as e:
        raise HorizonError(f"{p / SUMS}: cannot read ({e})") from None
    for line in lines:
        want, _, name = line.partition("  ")
        if not (p / name).is_file() or sha256_file(p / name) != want:
            raise HorizonError(f"{p / name}: checksum mismatch (corrupt or incomplete checkpoint)")


def read_meta(path) -> dict:
    p = Path(path) / META
    try:
        meta = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise HorizonError(f"{p}: cannot read ({type(e).__name__}: {e})") from None
    if meta.get("format") != FORMAT:
        raise HorizonError(f"{p}: checkpoint format {meta.get('format')!r}; this version reads {FORMAT}")
    return meta


def load_checkpoint(path, trainer, verify: bool = False) -> dict:
    """Restore a checkpoint (folder, or ckpt_dir for its latest) into `trainer`, which must
    be built for the same model and policy. Returns the metadata (meta['loop'] is the loop's
    state, meta['step'] the step it was taken after). verify: check checksums first."""
    from safetensors import safe_open

    trainer._check_usable()
    p = resolve(path)
    if verify:
        verify_checkpoint(p)
    meta = read_meta(p)
    for what, have in (("model", trainer.model.to_dict()), ("policy", trainer.policy.to_dict())):
        saved = meta[what]
        diff = [k for k in sorted(set(have) | set(saved)) if have.get(k) != saved.get(k)
                and not (what == "model" and k == "name")]
        if diff:
            k = diff[0]
            raise HorizonError(f"{p}: checkpoint was written for {what} {k}={saved.get(k)!r}, this run has "
                               f"{k}={have.get(k)!r}; resume with the same {what}")
    pending = bool(meta["trainer"]["pending"])
    want = dict(_state_items_for(trainer, pending))
    seen = set()
    try:
        with safe_open(str(p / STATE), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name not in want:
                    raise HorizonError(f"{p / STATE}: unexpected tensor {name!r}")
                t = f.get_tensor(name)
                dst = want[name]
                if tuple(t.shape) != tuple(dst.shape) or t.dtype != dst.dtype:
                    raise HorizonError(f"{p / STATE}: tensor {name!r} is {tuple(t.shape)} {t.dtype}, "
                                       f"the store has {tuple(dst.shape)} {dst.dtype}")
                dst.copy_(t)
                seen.add(name)
    except HorizonError:
        raise
    except Exception as e:
        raise HorizonError(f"{p / STATE}: cannot read ({type(e).__name__}: {e})") from None
    missing = [n for n in want if n not in seen]
    if missing:
        raise HorizonError(f"{p / STATE}: tensor {missing[0]!r} is missing")
    trainer._refresh_working_copy()
    tm = meta["trainer"]
    trainer.pending = pending
    trainer.pending_lr = float(tm["pending_lr"])
    trainer.lr = float(tm["lr"])
    trainer.steps_done = int(tm["steps_done"])
    return meta


def _state_items_for(trainer, pending: bool):
    was, trainer.pending = trainer.pending, pending
    try:
        return _state_items(trainer)
    finally:
        trainer.pending = was
