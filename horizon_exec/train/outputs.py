"""A training run's outputs (--ckpt-dir, --save-hf, --log-file) checked before the first step,
so that no run trains for hours and then finds it cannot keep what it made (issue 19).

    prepare_outputs(ckpt_dir="ckpt", save_hf="out", log_file="log.jsonl", init_from=None)
    check_space([("--ckpt-dir", Path("ckpt"), ckpt_bytes), ("--save-hf", Path("."), hf_bytes)])

prepare_outputs creates the folders (and missing parents, each made durable), checks each
output is of the right kind and can be written the way the run will write it (a file
created in --ckpt-dir; a folder created beside --save-hf, where it is built before its
rename; --log-file opened for appending), that --save-hf holds nothing but an HF checkpoint
(it is replaced as a whole), and that --save-hf is not the --init-from folder nor holds
another output. check_space compares what the writes need with the free space of each file
system (outputs on one file system add up). Every refusal is one HorizonError line naming the
flag, the path and what is needed. No torch here: the checks run before anything is built.

Work already on disk is not lost to a new run (issue 30): a fresh run (no --resume) in a
--ckpt-dir that holds checkpoints is refused unless --overwrite-ckpt says to start over (its
checkpoints are then removed once the run holds the folder's lock); a `latest` that is a
folder is refused (a resume would work, then the run would fail to replace it after training).
--report-dir (the run's predicted-vs-measured report; default <ckpt-dir>/report) is a folder
made and written into like the others.
A --ckpt-dir holds checkpoints and the run's own outputs only (ckpt_dir_rules.py, issue 43):
other files are refused unless --overwrite-ckpt (never removed), a name the checkpointer
replaces that holds something else is refused, and so is a --log-file or --save-hf among the
checkpointer's own files. follow_save_hf writes
through a --save-hf symbolic link into its target (created when missing) instead of replacing
the link. check_file_sizes compares the largest file the run writes (a checkpoint's state,
an HF shard) with the file size limit (`ulimit -f`) up front, as check_space does with the
free space.
"""
import os
import re
import resource
import tempfile
from pathlib import Path

from horizon_exec.checkpoints.fileio import make_dirs, os_error_text
from horizon_exec.train import ckpt_dir_rules
from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import refuse_non_regular
from horizon_sim.units import fmt_bytes


def _folder(path: Path, flag: str) -> None:
    """`path` exists as a folder (created if missing) and a file can be made in it."""
    if path.exists() and not path.is_dir():
        raise HorizonError(f"{flag} {str(path)!r} is a file; give a folder")
    try:
        make_dirs(path)
    except OSError as e:
        raise HorizonError(f"{flag} {str(path)!r}: cannot create the folder: {os_error_text(e)}; "
                           "give a folder this run can write") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".horizon-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise HorizonError(f"{flag} {str(path)!r}: cannot write in it: {os_error_text(e)}; "
                           "give a folder this run can write") from None


def _inside(a: Path, b: Path) -> bool:
    """a is b or lies under it (symbolic links resolved, missing parts taken as written)."""
    a, b = a.resolve(), b.resolve()
    return a == b or a.is_relative_to(b)


def _save_hf(out: Path, init_from, others: dict, flag: str = "--save-hf") -> None:
    """A folder a save replaces as a whole (--save-hf, --save-adapter): not the weights the run
    starts from nor holding another output, replaceable, and writable beside it."""
    from horizon_exec.checkpoints.hf_checkpoint import check_output_dir
    from horizon_exec.checkpoints.peft_adapter import check_adapter_dir

    if init_from and _inside(Path(init_from), out):
        raise HorizonError(f"{flag} {str(out)!r} would replace the --init-from folder {str(init_from)!r}, "
                           "the weights this run starts from; save to another folder")
    for other, p in others.items():
        if p and _inside(Path(p), out):
            raise HorizonError(f"{flag} {str(out)!r} would hold {other} {str(p)!r}, but the save replaces "
                               "the folder as a whole; give them separate places")
    if flag == "--save-adapter":
        check_adapter_dir(out, flag)
    else:
        try:
            check_output_dir(out)
        except HorizonError as e:
            raise HorizonError(f"{flag}: {e}") from None
    _folder(out.parent, f"{flag} {str(out)!r}: its parent")
    try:  # the checkpoint is built in a folder beside `out`, then renamed
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=out.parent))
    except OSError as e:
        raise HorizonError(f"{flag} {str(out)!r}: cannot create a folder beside it: {os_error_text(e)}; "
                           "give a folder this run can write") from None


def _log_file(path: Path) -> None:
    if path.is_dir():
        raise HorizonError(f"--log-file {str(path)!r} is a folder; give a file")
    _folder(path.parent, f"--log-file {str(path)!r}: its parent")
    # a FIFO would block the open until a reader comes; /dev/null, /dev/stderr are fine
    refuse_non_regular(path, "--log-file", allow_chardev=True)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise HorizonError(f"--log-file {str(path)!r}: cannot append to it: {os_error_text(e)}") from None


_STEP = re.compile(r"step-[0-9]+")   # ckpt.py's step folders (not imported: that module needs torch)


def step_folders(folder: Path) -> list[Path]:
    """The checkpoint step folders of a --ckpt-dir: its own and, of a run over several nodes,
    those of its node-J folders."""
    found = []
    for d in [folder, *sorted(folder.glob("node-*"))]:
        try:
            found += sorted(p for p in d.iterdir() if _STEP.fullmatch(p.name) and p.is_dir())
        except OSError:
            continue
    return found


def _ckpt_dir(folder: Path, resume, overwrite: bool, own: set[str]) -> None:
    """own: the names in `folder` of the run's other outputs (ckpt_dir_rules.own_names)."""
    from horizon_exec.checkpoints import ckpt_lock

    _folder(folder, "--ckpt-dir")
    nodes = sorted(p for p in folder.glob("node-*") if p.is_dir())
    for d in [folder, *nodes]:
        latest = d / "latest"
        if latest.is_dir() and not latest.is_symlink():  # a rename cannot replace a folder by a file
            raise HorizonError(f"--ckpt-dir: {str(latest)!r} is a folder; every checkpoint replaces this file "
                               "(it names the newest step folder): move the folder away")
        ckpt_dir_rules.refuse_risky_entries(d, own if d == folder else set())
    found = step_folders(folder)
    if not found:  # not a checkpoint folder yet: checked before the lock file is made in it
        ckpt_dir_rules.refuse_foreign_entries(folder, own, fresh=resume is None, overwrite=overwrite)
    if resume is not None:
        return
    # another run writing here is reported as such (its lock), not as checkpoints in the way
    ckpt_lock.release(ckpt_lock.acquire(folder))
    found = step_folders(folder)
    if found and not overwrite:
        raise HorizonError(f"--ckpt-dir {str(folder)!r} holds the checkpoints of an earlier run ({len(found)}, "
                           f"newest {found[-1].name}); continue it with --resume, start over with "
                           "--overwrite-ckpt (they are removed), or give another --ckpt-dir")


def follow_save_hf(save_hf: str) -> str:
    """--save-hf as the run writes it: a symbolic link is followed to its target (the link is
    kept and the save goes where it points; a missing target is created like any --save-hf),
    since the save replaces the folder by a rename, which would replace the link instead."""
    p = Path(save_hf)
    if not p.is_symlink():
        return save_hf
    target = os.path.realpath(p)
    if Path(target).is_symlink():   # a loop: realpath gives up on it
        raise HorizonError(f"--save-hf {save_hf!r}: a symbolic link that leads nowhere (a loop); give a folder")
    return target


def prepare_outputs(*, ckpt_dir=None, save_hf=None, log_file=None, init_from=None, resume=None,
                    overwrite_ckpt=False, report_dir=None, save_adapter=None) -> None:
    """Check (and create) every output before the run starts (module docstring). resume: the
    --resume value (None: a fresh run); overwrite_ckpt: a fresh run may replace the
    checkpoints in ckpt_dir; report_dir: --report-dir, the folder of the run's predicted-vs-measured
    report (the default one, <ckpt_dir>/report, is made when written: cli/train_plan.py)."""
    if ckpt_dir:  # an output among the checkpointer's own files would be replaced or removed with them
        for flag, p in (("--save-hf", save_hf), ("--save-adapter", save_adapter), ("--log-file", log_file),
                        ("--report-dir", report_dir)):
            if p:
                ckpt_dir_rules.refuse_inside_checkpoints(flag, Path(p), Path(ckpt_dir))
        if report_dir and Path(report_dir).resolve() == Path(ckpt_dir).resolve():  # its files: foreign to the next run
            raise HorizonError(f"--report-dir {report_dir!r} is the --ckpt-dir; give the report a folder of its own "
                               f"(default: {str(Path(ckpt_dir) / 'report')!r})")
    if save_hf:
        _save_hf(Path(save_hf), init_from, {"--ckpt-dir": ckpt_dir, "--log-file": log_file,
                                            "--report-dir": report_dir, "--save-adapter": save_adapter})
    if save_adapter:
        _save_hf(Path(save_adapter), init_from, {"--ckpt-dir": ckpt_dir, "--log-file": log_file,
                                                 "--report-dir": report_dir, "--save-hf": save_hf}, "--save-adapter")
    if ckpt_dir:
        own = ckpt_dir_rules.own_names(Path(ckpt_dir), (save_hf, save_adapter, log_file, report_dir))
        _ckpt_dir(Path(ckpt_dir), resume, overwrite_ckpt, own)
    if log_file:
        _log_file(Path(log_file))
    if report_dir:
        _folder(Path(report_dir), "--report-dir")


def file_size_limit() -> int | None:
    """The largest file this process may write (`ulimit -f`, RLIMIT_FSIZE), None: unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def check_file_sizes(needs) -> None:
    """needs: [(flag, file, bytes of the largest file written there)]. HorizonError when one
    is over the file size limit: the write would fail with EFBIG after training."""
    limit = file_size_limit()
    if limit is None:
        return
    for flag, path, nbytes in needs:
        if nbytes > limit:
            raise HorizonError(f"{flag}: {path} would be {fmt_bytes(nbytes)}, over this process's file size "
                               f"limit of {fmt_bytes(limit)} (ulimit -f); raise the limit"
                               + (" or lower --save-shard-size" if flag == "--save-hf" else "")
                               + " (--no-admission skips this check)")


def largest_shard_bytes(tensor_bytes, max_shard_bytes: int) -> int:
    """The largest safetensors file of an HF save whose tensors (in order) take `tensor_bytes`
    each, filled greedily up to max_shard_bytes (hf_checkpoint._shards' rule)."""
    largest = size = 0
    for n in tensor_bytes:
        if size and size + n > max_shard_bytes:
            size = 0
        size += n
        largest = max(largest, size)
    return largest


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged writer may still use on folder's file system (None: unknown,
    e.g. a file system that reports no sizes)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if st.f_blocks else None


def check_space(needs) -> None:
    """needs: [(flag, existing folder written into, bytes[, what the bytes are])]. HorizonError
    when a file system has less free space than the outputs on it need together."""
    by_fs: dict[int, list] = {}
    for flag, folder, nbytes, *detail in needs:
        by_fs.setdefault(os.stat(folder).st_dev, []).append((flag, folder, nbytes, detail[0] if detail else ""))
    for group in by_fs.values():
        need = sum(n for _, _, n, _ in group)
        free = free_bytes(group[0][1])
        if free is not None and free < need:
            what = " + ".join(f"{flag} {fmt_bytes(n)}" + (f": {d}" if d else "") for flag, _, n, d in group)
            raise HorizonError(f"{str(group[0][1])!r}: {fmt_bytes(free)} free on its file system; the run's "
                               f"outputs there need about {fmt_bytes(need)} ({what}); free space or write "
                               "elsewhere (--no-admission skips this check)")
