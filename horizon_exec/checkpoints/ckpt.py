"""Training checkpoints for exact resume.

A checkpoint is a folder `<ckpt_dir>/step-XXXXXXXX/` holding
    state.safetensors   the host store: fp32 master weights, Adam moments (m | v per unit),
                        the per-unit Adam step counters, the gradient norms, and, when a
                        pipelined update is pending, the previous step's host gradients
    trainer.json        everything else: step, pending flag and its lr, the model and policy
                        it was written for, optimizer hyper-parameters, and the training
                        loop's own state (data loader position, schedule settings, ...)
    SHA256SUMS          one line per file, `sha256sum -c` format
The working copy (bf16) is not stored: it is the master cast, recomputed on load. A split
master (policy split_master) is stored as the fp32 master it holds, joined a unit at a time,
and split again on load: the format is the same, so a run may resume with or without the
split (SAME_ON_DISK). The
folder is written under a temporary name, fsynced and renamed into place; then the text file
`<ckpt_dir>/latest` is replaced atomically to name it (for people and older versions: resume
orders the step folders itself, by step and by the publication number each trainer.json
records, so a run killed before `latest` moved still resumes from its newest step; see
candidates()), and checkpoints beyond `keep` are
renamed to a hidden name and removed (the newest `keep` up to the step written). A failure mid-write leaves the previous checkpoint and
`latest` untouched (a process killed mid-write leaves a hidden temporary folder, named by its
owner, which the next save on that host removes once the owner is dead): no half-written file
is ever under a final name. A save holds the folder's lock (ckpt_lock.py): one run per folder.

Loading verifies as it reads: trainer.json and state.safetensors are hashed and checked
against SHA256SUMS, the state in one pass (each tensor is read straight into the host store
and hashed on the way, so a terabyte store is not read twice), and a missing, truncated or
corrupted file is a CheckpointError naming it, and so are values no run writes (a NaN
master, a negative second moment, ...: ckpt_invariants.py). Given a ckpt_dir, the loader tries the step
folders newest first (candidates()) and warns for each one it skips, so a damaged last
checkpoint costs the steps since the previous one, not the run. A damaged `latest`, or one
naming anything but a step folder of this ckpt_dir (`../../x`), is reported and not followed.

What a checkpoint holds is the trainer's to declare (runtime/state_items.py, as
torch.distributed.checkpoint's Stateful): Trainer.state_items() names its tensors, with what
they hold, and the metadata; this module writes them, and a load reads a checkpoint into the
tensors state_items() names, refusing (one line, naming it) a file that lacks a declared tensor,
holds another, or holds one of another shape or dtype, before any byte lands; then it hands the
metadata back (Trainer.load_state_items). It reads nothing else of the trainer.

Resuming from a checkpoint into a trainer built with the same model and policy gives a run
whose next steps equal the uninterrupted run bit for bit (fp32): every number a step reads
is restored exactly.
"""
import dataclasses
import hashlib
import json
import os
import re
import shutil
import struct
from pathlib import Path

from horizon_exec.checkpoints import ckpt_invariants, ckpt_lock
from horizon_exec.checkpoints.fileio import (
    Deferred,
    OutputError,
    aside_name,
    atomic_write_text,
    fsync_dir,
    make_dirs,
    publish_dir,
    remove_dead_leftovers,
    sha256_file,
    staging_dir,
    write_failure,
    write_safetensors,
    write_text,
)
from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import kind_of

FORMAT = 1
STATE, META, SUMS, LATEST = "state.safetensors", "trainer.json", "SHA256SUMS", "latest"
_STEP_DIR = re.compile(r"step-([0-9]+)")   # fullmatch only: 'step-1/../x' or 'step-1\n' are not step folders


def node_folder(ckpt_dir, dist) -> str:
    """Where a node's checkpoints go: ckpt_dir itself, or ckpt_dir/node-J when a run has
    several nodes (each writes its shard of the host store)."""
    return str(ckpt_dir) if dist.layout.nodes == 1 else str(Path(ckpt_dir) / f"node-{dist.node}")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_bytes(trainer) -> int:
    """About the bytes one checkpoint takes on disk (with pending gradients: an upper bound)."""
    return _tensor_bytes(trainer.state_items(pending=True)) + (1 << 20)


def _tensor_bytes(items) -> int:
    return sum(t.target.numel() * t.target.element_size() for t in items.tensors.values())


_OWN_KEYS = ("format", "step", "loop", "generation")
"""trainer.json's keys that are the checkpoint's own, not the trainer's declaration."""


def save_checkpoint(ckpt_dir, trainer, step: int, loop_state: dict | None = None, keep: int = 2) -> Path:
    """Write checkpoint `step` (optimizer steps done) under ckpt_dir; returns its folder: what
    trainer.state_items() declares (runtime/state_items.py), and the loop's state. Does not
    flush a pending pipelined update: the pending gradients are saved instead, so the run's
    own overlap is not disturbed."""
    items = trainer.state_items()
    clash = [k for k in items.meta if k in _OWN_KEYS]
    if clash:
        raise ValueError(f"state_items() declares {clash[0]!r}, a key of the checkpoint's own")
    root = Path(ckpt_dir)
    final = root / step_dir_name(step)
    meta = {"format": FORMAT, "step": step, **items.meta, "loop": loop_state or {}}
    try:
        return _save(root, final, items, step, meta, keep)
    except OSError as e:  # disk full, quota, file size limit, read-only: nothing half-written stays
        raise OutputError(write_failure(f"checkpoint {final}", e, root if root.is_dir() else root.parent,
                                        _tensor_bytes(items) + (1 << 20))
                          + "; the checkpoints before it are intact") from None


def _save(root: Path, final: Path, items, step: int, meta: dict, keep: int) -> Path:
    make_dirs(root)
    with ckpt_lock.holding(root):
        # leftovers of runs killed mid-write (hidden, named by their owner: only dead ones go)
        remove_dead_leftovers(root, r"step-\d+|" + LATEST)
        meta = {**meta, "generation": next_generation(root)}   # publication order, for resume (candidates)
        with staging_dir(final) as tmp:
            sums = {STATE: write_safetensors(tmp / STATE, [(n, t.target, None) for n, t in items.tensors.items()],
                                             {"format": "horizon-ckpt", "step": step})}
            sums[META] = write_text(tmp / META, json.dumps(meta, indent=2) + "\n")
            write_text(tmp / SUMS, "".join(f"{h}  {n}\n" for n, h in sums.items()))
            publish_dir(tmp, final)
        atomic_write_text(root / LATEST, final.name + "\n")
        if keep > 0:  # the `keep` newest up to this step; newer folders (a run resumed from an older
            # checkpoint, e.g. after the latest was damaged) are left until this run overwrites them
            mine = [p for p in list_checkpoints(root) if _step_of(p) <= step]
            for old in mine[:-keep]:
                _remove(old)
    return final


def _step_of(p: Path) -> int:
    return int(_STEP_DIR.fullmatch(p.name).group(1))


def _remove(folder: Path) -> None:
    """Rename aside (atomic), then delete: an interrupted removal never leaves a partial
    checkpoint under a step name."""
    aside = aside_name(folder)
    try:
        os.rename(folder, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def remove_checkpoints(ckpt_dir) -> list[Path]:
    """Remove every step folder of ckpt_dir and its `latest` (a run told to start over,
    --overwrite-ckpt; the caller holds the folder's lock); returns the folders removed."""
    root = Path(ckpt_dir)
    gone = [p for _, p in sorted(_step_folders(root))]
    for p in gone:
        _remove(p)
    if (root / LATEST).is_file():
        os.unlink(root / LATEST)
    fsync_dir(root)
    return gone


def list_checkpoints(ckpt_dir) -> list[Path]:
    """Complete checkpoint folders (they have trainer.json), oldest first."""
    return [p for _, p in sorted(_step_folders(Path(ckpt_dir))) if (p / META).is_file()]


def latest_checkpoint(ckpt_dir) -> Path | None:
    """The complete checkpoint a resume tries first (candidates()), else None."""
    return next((p for p in candidates(ckpt_dir) if (p / META).is_file()), None)


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


def read_pointer(root: Path) -> tuple[str | None, str]:
    """(the step folder name `latest` holds, or None; what is wrong with it, '' if nothing).
    Only a plain `step-N` name counts: a damaged file or a path (`../../x`) is never followed."""
    ptr = root / LATEST
    if not ptr.exists():
        return None, ""
    if (kind := kind_of(ptr)) is not None:  # a FIFO would block the open: a damaged pointer
        return None, f"{ptr} is {kind}, not a file"
    try:
        with open(ptr, "rb") as f:
            raw = f.read(256)
        name = raw.decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{ptr} cannot be read ({type(e).__name__})"
    if not _STEP_DIR.fullmatch(name):
        return None, f"{ptr} does not name a step folder ({raw[:40]!r})"
    return name, ""


def _generation(folder: Path) -> int | None:
    """The publication number recorded in a checkpoint's trainer.json (None: unreadable, or
    written before it was recorded). An ordering hint only: the load verifies everything."""
    try:
        with open(folder / META, "rb") as f:
            meta = json.loads(f.read(1 << 20))
        g = meta.get("generation") if isinstance(meta, dict) else None
    except (OSError, ValueError, RecursionError):
        return None
    return g if isinstance(g, int) and not isinstance(g, bool) else None


def candidates(path) -> list[Path]:
    """Checkpoints to try, in order: [path] when it is a checkpoint folder; for a ckpt_dir,
    every step-N folder (complete or not: a damaged one is reported when it is tried), newest
    first, except that a folder published before a checkpoint of a lower step (an abandoned
    trajectory: a run resumed from an older checkpoint wrote that lower step later) goes
    last. So a run killed between publishing step N and pointing `latest` at it resumes from
    N. `latest` only decides for folders written before publication numbers were recorded."""
    p = Path(path)
    if not p.is_dir():
        return []
    # A folder named step-N is a (maybe damaged) checkpoint unless it holds step folders itself: then
    # it is a ckpt_dir that happens to be called so (--ckpt-dir runs/step-7), resumed like any other.
    if ((p / META).is_file() or (p / SUMS).is_file() or (p / STATE).exists()
            or (_STEP_DIR.fullmatch(p.name) and not _step_folders(p))):
        return [p]
    steps = sorted(_step_folders(p), reverse=True)
    gen = {q: _generation(q) for _, q in steps}
    later = None       # the highest generation among lower steps, walking up from the lowest step
    superseded = set()
    for _, q in reversed(steps):
        g = gen[q]
        if g is not None and later is not None and later > g:
            superseded.add(q)
        if g is not None:
            later = g if later is None else max(later, g)
    order = [q for _, q in steps if q not in superseded] + [q for _, q in steps if q in superseded]
    named, _ = read_pointer(p)
    if named is not None and (p / named) in gen and gen[p / named] is None:
        order.remove(p / named)
        order.insert(0, p / named)
    return order


def next_generation(root: Path) -> int:
    """1 + the highest publication number in root's checkpoints (1 for the first)."""
    gens = [g for _, q in _step_folders(root) if (g := _generation(q)) is not None]
    return max(gens, default=0) + 1


def _step_folders(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    return [(int(m.group(1)), q) for q in root.iterdir() if (m := _STEP_DIR.fullmatch(q.name)) and q.is_dir()]


# ---- verification ------------------------------------------------------------------------------
class CheckpointError(HorizonError):
    """A checkpoint file is missing, truncated or corrupted (the message names the file)."""


def _sums(p: Path) -> dict[str, str]:
    """name -> SHA-256 from SHA256SUMS; it must list the state and the metadata."""
    f = p / SUMS
    _exists(f)
    try:
        lines = f.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f}: cannot read ({type(e).__name__}: {e}); the checkpoint is incomplete") from None
    sums = {}
    for line in lines:
        want, sep, name = line.partition("  ")
        # a plain file name of this folder: a listed '../x' or '/etc/x' is never opened
        if not sep or not re.fullmatch(r"[0-9a-f]{64}", want) or not _PLAIN_NAME.fullmatch(name) or name in (".", ".."):
            raise CheckpointError(f"{f}: malformed line {line[:100]!r} (corrupt checkpoint)")
        sums[name] = want
    for name in (STATE, META):
        if name not in sums:
            raise CheckpointError(f"{f}: no checksum for {name} (corrupt checkpoint)")
    return sums


def _state_header(f, path: Path, size: int) -> tuple[bytes, dict, int]:
    """(raw header bytes incl. the length prefix, header, total size the header declares)."""
    head = f.read(8)
    if len(head) < 8:
        raise CheckpointError(f"{path}: truncated ({size} bytes, not even a header)")
    n = struct.unpack("<Q", head)[0]
    if 8 + n > size:
        raise CheckpointError(f"{path}: truncated or corrupt ({size} bytes, the header alone claims {8 + n})")
    hb = f.read(n)
    try:
        header = json.loads(hb)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: corrupt header ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt header (a JSON {type(header).__name__}, not an object)")
    for k, v in header.items():
        why = _entry_problem(k, v)
        if why:
            raise CheckpointError(f"{path}: corrupt header (entry {show(k)}: {why})")
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    total = 8 + n + max(ends, default=0)
    if size < total:
        raise CheckpointError(f"{path}: truncated ({size} bytes, the header declares {total})")
    if size > total:
        raise CheckpointError(f"{path}: {size - total} bytes more than the header declares (corrupt checkpoint)")
    return head + hb, header, total


_PLAIN_NAME = re.compile(r"[^/\\\x00]{1,255}")


def _nonneg_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _entry_problem(k: str, v) -> str:
    """What is wrong with one safetensors header entry ('' if nothing)."""
    if k == "__metadata__":
        return "" if isinstance(v, dict) else "not an object"
    if not isinstance(v, dict):
        return "not an object"
    if not isinstance(v.get("dtype"), str):
        return f"dtype {show(v.get('dtype'))}"
    shape, off = v.get("shape"), v.get("data_offsets")
    if not isinstance(shape, list) or not all(_nonneg_int(d) for d in shape):
        return f"shape {show(shape)}"
    if not (isinstance(off, list) and len(off) == 2 and all(_nonneg_int(o) for o in off) and off[0] <= off[1]):
        return f"data_offsets {show(off)}"
    return ""


def show(x) -> str:
    """A damaged value in a one-line message: repr (no raw newlines), at most 60 characters."""
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


def _exists(path: Path) -> None:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (incomplete checkpoint)")


def verify_checkpoint(path) -> None:
    """Check every file against SHA256SUMS (and the state's size against its header);
    CheckpointError (a HorizonError) naming the file on the first problem."""
    p = Path(path)
    sums = _sums(p)
    st = p / STATE
    _exists(st)
    with open(st, "rb") as f:
        _state_header(f, st, st.stat().st_size)
    for name, want in sums.items():
        _exists(p / name)
        if sha256_file(p / name) != want:
            raise CheckpointError(f"{p / name}: checksum mismatch (corrupt or incomplete checkpoint)")


def _read_meta_bytes(p: Path, want_sha: str | None) -> dict:
    f = p / META
    _exists(f)
    data = f.read_bytes()
    if want_sha is not None and hashlib.sha256(data).hexdigest() != want_sha:
        raise CheckpointError(f"{f}: checksum mismatch (corrupt checkpoint)")
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{f}: cannot read ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{f}: a JSON {type(meta).__name__}, not an object (corrupt checkpoint)")
    fmt = meta.get("format")
    if _nonneg_int(fmt) and fmt != FORMAT:  # not damage: another version wrote it
        raise HorizonError(f"{f}: checkpoint format {fmt}; this version reads {FORMAT}")
    why = _meta_problem(meta)
    if why:
        raise CheckpointError(f"{f}: {why} (corrupt checkpoint)")
    return meta


def _meta_problem(meta: dict) -> str:
    """What is wrong with trainer.json's fields ('' if nothing): everything a load reads from
    it is checked here, so a damaged file is a CheckpointError naming it, never a KeyError."""
    from horizon_exec.optim.adamw import MAX_LR

    if meta.get("format") != FORMAT:
        return f"format {show(meta.get('format'))}"
    if not _nonneg_int(meta.get("step")):
        return f"step {show(meta.get('step'))}"
    for key in ("trainer", "model", "policy"):
        if not isinstance(meta.get(key), dict):
            return f"{key} {show(meta.get(key))}"
    for key in ("optimizer", "loop"):
        if not isinstance(meta.get(key, {}), dict):
            return f"{key} {show(meta.get(key))}"
    if "generation" in meta and not _nonneg_int(meta["generation"]):
        return f"generation {show(meta['generation'])}"
    tm = meta["trainer"]
    if not isinstance(tm.get("pending"), bool):
        return f"trainer.pending {show(tm.get('pending'))}"
    if not _nonneg_int(tm.get("steps_done")):
        return f"trainer.steps_done {show(tm.get('steps_done'))}"
    if not _nonneg_int(tm.get("skipped_steps", 0)):  # absent in checkpoints of older versions
        return f"trainer.skipped_steps {show(tm.get('skipped_steps'))}"
    for key in ("pending_lr", "lr"):
        x = tm.get(key)
        if not (isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= MAX_LR):
            return f"trainer.{key} {show(x)}"
    return ""


def read_meta(path, verify: bool = False) -> dict:
    """trainer.json of a checkpoint folder (verify: against SHA256SUMS first)."""
    p = Path(path)
    return _read_meta_bytes(p, _sums(p)[META] if verify else None)


def _recorded(path, key: str):
    """The `key` metadata of the checkpoint resume would load first; None when it cannot be
    read (the load itself then says what is wrong)."""
    for p in candidates(path):
        try:
            return read_meta(p, verify=True).get(key)
        except (HorizonError, OSError, ValueError, AttributeError, KeyError):
            continue  # damaged: resume falls back past it, and so does this
    return None


def recorded_compute_threads(path) -> int | None:
    """The CPU backend's compute threads the checkpoint resume would load first was written with
    (its "runtime" metadata: state_items.py); None when it records none (older checkpoints, a GPU
    run) or cannot be read."""
    n = (_recorded(path, "runtime") or {}).get("compute_threads")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def recorded_policy(path) -> dict | None:
    """The policy (Policy.to_dict) the checkpoint resume would load first was written with;
    None when it cannot be read."""
    pol = _recorded(path, "policy")
    if not isinstance(pol, dict):
        return None
    renamed = RENAMED_FIELDS["policy"]
    return {renamed.get(k, k): v for k, v in pol.items()}


# ---- loading ----------------------------------------------------------------------------------
_CHUNK = 1 << 26  # bytes read (and hashed) per call: 64 MiB


def _read_state(path: Path, want: dict, want_sha: str | None, on_first_write, problem=None) -> None:
    """Read state.safetensors in one pass straight into the `want` tensors (name -> tensor,
    matching dtype and shape), hashing every byte; CheckpointError on any mismatch (the names,
    dtypes, shapes and offsets are checked against `want` before on_first_write). A name
    mapped to None is skipped unread (data parallel: the node's shared store, which its leader
    reads; then nothing is hashed and want_sha must be None). problem(name, tensor): what is
    wrong with a tensor's values once read ('' if nothing; ckpt_invariants.py), a CheckpointError."""
    import torch

    from horizon_exec.checkpoints.fileio import ST_DTYPE

    _exists(path)
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        raw_header, header, _ = _state_header(f, path, size)
        h.update(raw_header)
        entries = sorted((v["data_offsets"][0], v["data_offsets"][1], k, v)   # checked by _state_header
                         for k, v in header.items() if k != "__metadata__")
        names = {k for *_, k, _v in entries}
        if names != set(want):
            extra, missing = sorted(names - set(want)), sorted(set(want) - names)
            what = f"unexpected tensor {show(extra[0])}" if extra else f"tensor {show(missing[0])} is missing"
            raise CheckpointError(f"{path}: {what} (corrupt header, or a checkpoint of another build)")
        pos = 0
        for begin, end, name, v in entries:  # every tensor as declared before the first byte lands
            dst = want[name]
            if dst is None:
                if want_sha is not None:
                    raise ValueError("a checksum cannot be verified while skipping tensors")
            elif v["dtype"] != ST_DTYPE.get(dst.dtype) or v["shape"] != list(dst.shape):
                raise CheckpointError(f"{path}: tensor {show(name)} is {show(v['shape'])} {show(v['dtype'])}, "
                                      f"the store has {list(dst.shape)} {ST_DTYPE.get(dst.dtype)} (corrupt header)")
            elif begin != pos or end - begin != dst.numel() * dst.element_size():
                raise CheckpointError(f"{path}: tensor {show(name)} has offsets [{begin}, {end}) (corrupt header)")
            pos = end
        started, bad_values = False, ""
        for begin, end, name, _v in entries:
            dst = want[name]
            if dst is None:
                f.seek(end - begin, 1)
                continue
            if not started:
                on_first_write()
                started = True
            deferred = dst if isinstance(dst, Deferred) else None
            if deferred:
                dst = torch.empty(deferred.shape, dtype=deferred.dtype)
            mv = memoryview(dst.detach().reshape(-1).view(torch.uint8).numpy())
            off = 0
            while off < len(mv):
                got = f.readinto(mv[off:off + _CHUNK])
                if not got:
                    raise CheckpointError(f"{path}: truncated while reading {name!r}")
                h.update(mv[off:off + got])
                off += got
            why = problem(name, dst) if problem is not None and not bad_values else ""
            if why:  # reported once the checksum is known: a mismatch is the better diagnosis
                bad_values = f"{path}: tensor {show(name)} holds {why} (corrupt checkpoint)"
            if deferred and deferred.done:
                deferred.done(dst)
        if f.read(1):
            raise CheckpointError(f"{path}: trailing bytes after the last tensor (corrupt checkpoint)")
    if want_sha is not None and h.hexdigest() != want_sha:
        raise CheckpointError(f"{path}: checksum mismatch (corrupt checkpoint)")
    if bad_values:
        raise CheckpointError(bad_values)


def _field_defaults(spec) -> dict:
    """{field: default in to_dict's JSON form} of a spec dataclass (fields that have one)."""
    out = {}
    for f in dataclasses.fields(spec):
        if f.default is not dataclasses.MISSING:
            out[f.name] = list(f.default) if isinstance(f.default, tuple) else f.default
    return out


RENAMED_FIELDS = {"policy": {"ckpt_every": "act_ckpt_every", "ckpt_on": "act_ckpt_on"}}
"""Spec fields renamed since a checkpoint may have been written: old name -> new name."""
IMPLIED_FIELDS = {"policy": {"grad_clip", "grad_dtype", "working_copy"}}
"""Fields whose default follows another choice (Policy.from_choices: --optimizer backward turns
grad_clip off, --compute-dtype fp32 sets grad_dtype and drops the working copy): a refused resume
names the choice that differs before these, since the user changed that, not them."""
SAME_ON_DISK = {"policy": {"split_master"}, "model": {"init_std"}}
"""Fields that change how the host store holds the state, not what a checkpoint holds (a split
master is saved as the fp32 master; the std of the random init, which a resume does not
redo): a run may resume with another value."""


def check_compatible(p: Path, meta: dict, trainer) -> None:
    """HorizonError (one line, naming the first difference) when the checkpoint `meta` (its
    trainer.json) was written for another layout, model or policy than `trainer` declares
    (state_items().meta)."""
    _check_compatible(p, meta, trainer.state_items(pending=False).meta)


def _check_compatible(p: Path, meta: dict, declared: dict) -> None:
    from horizon_sim.specs.model import ModelSpec
    from horizon_sim.specs.policy import Policy

    lay, mine = meta.get("layout", {}), declared["layout"]
    if not isinstance(lay, dict):
        raise CheckpointError(f"{p / META}: layout {show(lay)} is not an object (corrupt checkpoint)")
    have = (lay.get("nodes", 1), lay.get("devices_per_node", 1), lay.get("node", 0))
    if have != (mine["nodes"], mine["devices_per_node"], mine["node"]):
        raise HorizonError(f"{p}: checkpoint holds node {have[2]}'s store of a run of {have[0]} node(s) x {have[1]} "
                           f"device(s); this is node {mine['node']} of {mine['nodes']} node(s) x "
                           f"{mine['devices_per_node']} device(s): resume with the same --nnodes and --nproc-per-node")
    for what, spec in (("model", ModelSpec), ("policy", Policy)):
        have = declared[what]
        renamed = RENAMED_FIELDS.get(what, {})
        written = {renamed.get(k, k): v for k, v in meta.get(what, {}).items()}
        # A field the checkpoint does not name was added after it was written: it ran with
        # the field's default.
        saved = {**{k: v for k, v in _field_defaults(spec).items() if k in have}, **written}
        implied = IMPLIED_FIELDS.get(what, {})
        diff = sorted((k for k in set(have) | set(saved) if have.get(k) != saved.get(k)
                       and not (what == "model" and k == "name") and k not in SAME_ON_DISK.get(what, ())),
                      key=lambda k: (k in implied, k))   # the choice first, what it implies after
        if diff:
            k = diff[0]
            k_ = k if re.fullmatch(r"\w{1,40}", k) else show(k)
            too = [j for j in diff[1:] if j in implied]
            raise HorizonError(f"{p}: checkpoint was written for {what} {k_}={show(saved.get(k))}, this run has "
                               f"{k_}={show(have.get(k))}" + (f" ({', '.join(too)} differs too)" if too else "")
                               + f"; resume with the same {what}")


def _load_one(p: Path, trainer, verify: bool, check) -> dict:
    sums = _sums(p) if verify else {}
    meta = _read_meta_bytes(p, sums.get(META))
    _check_compatible(p, meta, trainer.state_items(pending=bool(meta["trainer"]["pending"])).meta)
    if check is not None:
        check(p, meta)
    steps_done = int(meta["trainer"]["steps_done"])

    def read(items, invalidate):
        """The declared tensors <- state.safetensors: the same names, shapes and dtypes, or a
        CheckpointError naming the first that differs."""
        declared = items.tensors
        want = {n: (t.target if t.owned else None) for n, t in declared.items()}
        # a rank that skips the node's shared store (its leader reads it) cannot hash the file
        sha = sums.get(STATE) if all(t.owned for t in declared.values()) else None
        _read_state(p / STATE, want, sha, lambda: invalidate(f"loading {p / STATE} failed part way"),
                    lambda name, t: ckpt_invariants.value_problem(name, t, declared[name].holds, steps_done))

    trainer.load_state_items(meta["trainer"], read)
    meta["path"] = str(p)
    return meta


def load_checkpoint(path, trainer, verify: bool = True, check=None, warn=print) -> dict:
    """Restore a checkpoint into `trainer` (built for the same model and policy) and return
    its metadata (meta['step']: the step it was taken after; meta['loop']: the loop's state;
    meta['path']: the folder loaded). `path`: a checkpoint folder (loaded or a clear error),
    or a ckpt_dir: its latest checkpoint, falling back to older ones, with a `warn`ing for
    each damaged one skipped. verify: check the checksums while reading (default).
    check(folder, meta): called before the state is read (e.g. the loop's data check); its
    error is not a damaged checkpoint and stops the load. A failure after the store was
    partly overwritten leaves the trainer refusing to step until a load succeeds. `trainer`:
    anything with the Stateful protocol of runtime/state_items.py (state_items,
    load_state_items), which is all this module reads of it."""
    trainer.state_items(pending=False)  # a trainer that failed mid-step takes no checkpoint: said before any file is read
    cands = candidates(path)
    _, bad_pointer = read_pointer(Path(path)) if Path(path).is_dir() else (None, "")
    if bad_pointer and len(cands) > 1:
        warn(f"warning: {bad_pointer}; trying the step folders, newest first")
    if not cands:
        raise HorizonError(f"no checkpoint in {str(path)!r} (want a step-N folder with {META}, or a "
                           f"checkpoint folder holding one)")
    errors = []
    for i, p in enumerate(cands):
        try:
            meta = _load_one(p, trainer, verify, check)
        except CheckpointError as e:
            if len(cands) == 1:
                raise
            errors.append(str(e))
            nxt = f"trying {cands[i + 1].name}" if i + 1 < len(cands) else "no older checkpoint left"
            warn(f"warning: skipping checkpoint {p.name}: {e}; {nxt}")
            continue
        if errors:
            warn(f"warning: resumed from {p.name}, an older checkpoint than the latest "
                 f"({len(errors)} damaged one(s) skipped)")
        return meta
    raise CheckpointError(f"no intact checkpoint in {str(path)!r}: " + "; ".join(errors))
