"""Folders and files that only this user (or root) can change: where a process may keep code it
loads, or verdicts it trusts, between runs.

The native AdamW kernel is a shared object that the trainer dlopens (its constructors run as
whoever started `horizon`), cached with the verdict of its self-test. Kept in a folder another
user can write, or can swap for a folder of theirs, it runs their code as you. A folder is
private (why_not_private) when its path is absolute and, after symbolic links are resolved:
  - it is owned by the effective uid and not writable by group or others, and
  - every folder above it is owned by root or the effective uid and not writable by group or
    others unless it has the sticky bit (/tmp: no one renames or removes what they do not own
    there).
This is OpenSSH's StrictModes rule. The path is resolved once and the caller uses the resolved
path, so a link that someone could repoint later is never followed again; nothing else on that
path can change under the caller. A file inside is trusted (file_problem) when it is a regular
file (not a link), owned by the effective uid and not writable by group or others.
"""
import os
import stat
from pathlib import Path


class NotPrivate(Exception):
    """A folder other users could change (or not an absolute path); the message says which part and why."""


def horizon_cache_dir(kind: str) -> Path:
    """The per-user cache folder of `kind` ('native': the AdamW kernel, 'machines': calibrations),
    not yet checked (make_private_dir does that): $HORIZON_CACHE_DIR/<kind>, else
    $XDG_CACHE_HOME/horizon/<kind>, else ~/.cache/horizon/<kind>. The XDG spec: an empty or
    relative XDG_CACHE_HOME is ignored (taken as is, "" made the cache ./horizon/<kind>: code
    built into and loaded from wherever the user stands)."""
    d = os.environ.get("HORIZON_CACHE_DIR")
    if d:
        return Path(d) / kind
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "horizon" / kind


def make_private_dir(path, link_ok: bool = True) -> Path:
    """The real path of folder `path`, created with mode 0700 where missing (parents too), once
    it is private; NotPrivate saying why it is not; OSError when it cannot be created.
    link_ok=False: `path` itself may not be a symbolic link (a predictable name in a shared
    folder: whoever made the link chose where it leads)."""
    p = Path(path)
    if not p.is_absolute():  # relative to wherever the user stands: anyone's folder
        raise NotPrivate(f"{str(path)!r} is not an absolute path")
    for d in [*reversed(p.parents), p]:
        try:
            os.mkdir(d, 0o700)  # never group- or world-writable, whatever the umask
        except FileExistsError:
            pass
        except OSError:
            if not os.path.isdir(d):  # an existing folder above it may refuse mkdir (EACCES, EROFS)
                raise
    if not link_ok and p.is_symlink():
        raise NotPrivate(f"{p} is a symbolic link")
    real = Path(os.path.realpath(p))
    why = why_not_private(real)
    if why:
        raise NotPrivate(why)
    return real


def why_not_private(folder: Path) -> str:
    """'' when the absolute, resolved `folder` is private (module docstring), else why not, naming the part."""
    euid = os.geteuid()
    for depth, d in enumerate([folder, *folder.parents]):
        try:
            st = os.lstat(d)
        except OSError as e:
            return f"{d}: {e.strerror}"
        if stat.S_ISLNK(st.st_mode):  # it was resolved: a link now is one swapped in since
            return f"{d} is a symbolic link"
        if not stat.S_ISDIR(st.st_mode):
            return f"{d} is not a folder"
        if st.st_uid != euid and (depth == 0 or st.st_uid != 0):
            return f"{d} is owned by uid {st.st_uid}, not by you (uid {euid})" + ("" if depth == 0 else " or root")
        if st.st_mode & 0o022 and (depth == 0 or not st.st_mode & stat.S_ISVTX):
            return f"{d} is writable by {_writers(st.st_mode)} (mode {st.st_mode & 0o7777:04o})"
    return ""


def file_problem(path) -> str:
    """'' when `path` is absent or a regular file of the effective uid that no one else can
    write; else why it cannot be trusted (a link, not a file, another owner, writable by others)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as e:
        return f"{path}: {e.strerror}"
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_uid != euid:
        return f"{path} is owned by uid {st.st_uid}, not by you (uid {euid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by {_writers(st.st_mode)} (mode {st.st_mode & 0o7777:04o})"
    return ""


def _writers(mode: int) -> str:
    return " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
