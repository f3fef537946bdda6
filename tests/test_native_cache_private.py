"""Issue 43: the native AdamW kernel is a shared object the trainer dlopens (its constructors run as
the user), cached with the verdict of its self-test. It used to be loaded from folders other users
can write: the predictable fallback $TMPDIR/horizon-native-<uid> (made first by someone else, with
their .so and checksum in it), a cache folder writable by others, and, with XDG_CACHE_HOME="",
./horizon/native wherever the user stood. Now only a private folder (owned by you, not writable
by others, nor any folder above it but sticky ones; horizon_exec/private_dir.py) is used, and in
it only files of yours that no one else can write.

A planted object here is adamw.c itself plus a constructor that writes a marker file: loaded,
it works as the kernel and leaves the marker."""
import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from horizon_exec.optim import native

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture(scope="module")
def machine_build(tmp_path_factory) -> Path:
    """This machine's verified build, the .so beside its .sha256 and .verified (copied from the
    user's cache when there is one: saves a compile)."""
    d = tmp_path_factory.mktemp("machine")
    if native.cache_dir().is_dir():
        shutil.copytree(native.cache_dir(), d / "native")
    mp = pytest.MonkeyPatch()
    mp.setenv("HORIZON_CACHE_DIR", str(d))
    mp.delenv("HORIZON_NATIVE", raising=False)
    try:
        fns, status = native.load()
    finally:
        mp.undo()
    if fns is None:
        pytest.skip(status)  # no compiler here
    return _so_of(status)


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A clean setting: no HORIZON_CACHE_DIR or XDG_CACHE_HOME, HOME and TMPDIR under tmp_path,
    the current folder an empty tmp_path/cwd."""
    for var in ("HORIZON_CACHE_DIR", "XDG_CACHE_HOME", "HORIZON_NATIVE"):
        monkeypatch.delenv(var, raising=False)
    for d in ("home", "tmp", "cwd"):
        (tmp_path / d).mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(native.tempfile, "tempdir", None)  # re-read TMPDIR
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(native, "_warned", set(), raising=False)  # each test sees its own warning
    return tmp_path


def _seed(folder: Path, build: Path) -> None:
    """folder holds this machine's verified build, as a private cache would."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for f in build.parent.glob("kernels-*"):
        shutil.copy(f, folder / f.name)


def _so_of(status: str) -> Path:
    """The loaded object's path in load()'s status: '(ISA, threads; PATH[; notes])'."""
    assert status.startswith("(") and ".so" in status, status
    return Path(status.split("; ")[1].rstrip(")"))


def _loaded_from(status: str) -> Path:
    return _so_of(status).parent


@pytest.fixture(scope="module")
def planted(tmp_path_factory, machine_build) -> tuple[Path, Path]:
    """(an object that works as the kernel and whose constructor writes the marker, the marker)."""
    d = tmp_path_factory.mktemp("planted")
    marker, src, so = d / "constructor-ran", d / "planted.c", d / machine_build.name
    src.write_text("".join(f'#include "{f}"\n' for f in native.SOURCES) + '#include <stdio.h>\n'
                   '__attribute__((constructor)) static void planted(void) {\n'
                   f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran\\n", f); fclose(f); }}\n}}\n')
    subprocess.run([os.environ.get("CC", "cc"), *native.BASE_FLAGS, str(src), "-o", str(so), "-lm"], check=True)
    return so, marker


def _plant(folder: Path, planted: tuple[Path, Path]) -> Path:
    """The planted object in folder under the name of this machine's build, with a matching
    .sha256 and .verified: everything a cache check looked at. Returns the marker it writes."""
    so, marker = planted
    with contextlib.suppress(FileNotFoundError):
        marker.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / so.name
    shutil.copy(so, out)
    out.with_suffix(".sha256").write_text(native._sha256(out) + "\n")
    out.with_suffix(".verified").write_text(native._fingerprint(out) + "\n")
    return marker


@pytest.mark.parametrize("xdg", ["", "relative/cache"])
def test_an_empty_or_relative_xdg_cache_home_is_ignored(env, machine_build, monkeypatch, xdg):
    """The XDG spec: such a value is ignored, so the cache is ~/.cache; never under the current folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    home_cache = env / "home" / ".cache" / "horizon" / "native"
    assert native.cache_dir() == home_cache
    _seed(home_cache, machine_build)
    fns, status = native.load()
    assert fns is not None and _loaded_from(status) == home_cache, status
    assert os.listdir(env / "cwd") == []


def test_a_relative_horizon_cache_dir_is_not_used(env, machine_build, monkeypatch, capsys):
    """A relative folder is wherever the user stands: refused, said in one line, built elsewhere."""
    monkeypatch.setenv("HORIZON_CACHE_DIR", "rel")
    _seed(env / "tmp" / f"horizon-native-{os.geteuid()}", machine_build)
    fns, status = native.load()
    assert fns is not None and _loaded_from(status) == env / "tmp" / f"horizon-native-{os.geteuid()}", status
    assert os.listdir(env / "cwd") == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'rel/native' is not an absolute path" in err, err


PLANTS = {
    # where the planted build is, and how another user could have put it there
    "temp fallback made by another user": (lambda env: env / "tmp" / f"horizon-native-{os.geteuid()}", "chown"),
    "temp fallback world-writable": (lambda env: env / "tmp" / f"horizon-native-{os.geteuid()}", 0o777),
    "cache folder group-writable": (lambda env: env / "cache" / "native", 0o770),
    "cache under a world-writable folder": (lambda env: env / "cache" / "native", "parent 0777"),
}


@pytest.mark.parametrize("case", [pytest.param(k, marks=as_root) if PLANTS[k][1] == "chown" else k for k in PLANTS])
def test_a_build_planted_where_others_can_write_is_never_loaded(env, machine_build, planted, monkeypatch, capsys,
                                                               case):
    folder_of, how = PLANTS[case]
    folder = folder_of(env)
    if "cache" in case:
        monkeypatch.setenv("HORIZON_CACHE_DIR", str(env / "cache"))
        _seed(env / "tmp" / f"horizon-native-{os.geteuid()}", machine_build)  # the fallback, yours: no compile
    else:
        (env / "a-file").write_text("not a folder: the cache cannot be made, the temp fallback is tried")
        monkeypatch.setenv("HORIZON_CACHE_DIR", str(env / "a-file"))
    marker = _plant(folder, planted)
    if how == "chown":
        for p in [folder, *folder.iterdir()]:
            os.chown(p, NOBODY, NOBODY)
    elif how == "parent 0777":
        os.chmod(folder, 0o700)
        os.chmod(folder.parent, 0o777)  # anyone can rename native/ away and put theirs in its place
    else:
        os.chmod(folder, how)

    fns, status = native.load()
    assert not marker.exists(), "the planted object's constructor ran"
    assert fns is not None and _loaded_from(status) != folder, status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "horizon: warning: the native AdamW kernel is not cached in" in err
    assert str(folder) in err, err


def test_files_another_user_could_write_are_not_trusted_in_a_private_cache(env, planted, monkeypatch):
    """The folder is yours, but an object, checksum and verdict that others may write (left from
    when it was not private) are removed and rebuilt: never loaded, not even by the self-test's child."""
    cache = env / "cache" / "native"
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(env / "cache"))
    marker = _plant(cache, planted)
    for p in cache.iterdir():
        os.chmod(p, 0o666)
    os.chmod(env / "cache", 0o700)
    os.chmod(cache, 0o700)

    fns, status = native.load()
    assert not marker.exists(), "the planted object's constructor ran"
    assert fns is not None and _loaded_from(status) == cache, status
    assert "untrusted" in status and "writable by group and others (mode 0666)" in status and "rebuilt" in status
    assert all(p.stat().st_mode & 0o022 == 0 for p in cache.iterdir())  # what was rebuilt is yours alone


@as_root
def test_a_verdict_owned_by_another_user_is_not_trusted(env, machine_build, monkeypatch):
    cache = env / "cache" / "native"
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(env / "cache"))
    _seed(cache, machine_build)
    (verdict,) = cache.glob("*.verified")
    os.chown(verdict, NOBODY, NOBODY)
    fns, status = native.load()
    assert fns is not None and f"owned by uid {NOBODY}" in status and "rebuilt" in status, status
    assert verdict.stat().st_uid == os.geteuid()


def test_the_self_test_child_does_not_import_from_the_current_folder(env, machine_build, monkeypatch):
    """`python -m` puts the current folder first on sys.path: a horizon_exec/ planted where the
    user stands ran, as the user, in the self-test's child."""
    marker = env / "planted-package-ran"
    pkg = env / "cwd" / "horizon_exec"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    cache = env / "cache" / "native"
    monkeypatch.setenv("HORIZON_CACHE_DIR", str(env / "cache"))
    _seed(cache, machine_build)
    for v in cache.glob("*.verified"):
        v.unlink()  # the object's self-test runs again, in a child
    fns, status = native.load()
    assert not marker.exists(), "a package in the current folder ran in the self-test's child"
    assert fns is not None and "rebuilt" not in status, status


def test_private_dir_rules(tmp_path):
    """private_dir's rule, part by part: created 0700; a sticky shared folder above is fine, a
    world-writable one is not; a link is resolved and its target checked."""
    from horizon_exec.private_dir import NotPrivate, file_problem, make_private_dir, why_not_private
    old = os.umask(0o002)  # a umask that would make group-writable folders
    try:
        made = make_private_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert made == tmp_path / "a" / "b"
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700 and made.stat().st_mode & 0o777 == 0o700

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    assert make_private_dir(shared / "mine") == shared / "mine"
    os.chmod(shared, 0o777)
    with pytest.raises(NotPrivate, match=r"shared is writable by group and others \(mode 0777\)"):
        make_private_dir(shared / "mine")
    with pytest.raises(NotPrivate, match="not an absolute path"):
        make_private_dir("relative")

    (tmp_path / "link").symlink_to(made)
    assert make_private_dir(tmp_path / "link") == made
    with pytest.raises(NotPrivate, match="link is a symbolic link"):  # a predictable name: someone else's link
        make_private_dir(tmp_path / "link", link_ok=False)
    (tmp_path / "to-shared").symlink_to(shared)
    assert "writable by group and others" in why_not_private(Path(os.path.realpath(tmp_path / "to-shared")))

    f = made / "f"
    f.write_text("x")
    os.chmod(f, 0o600)
    assert file_problem(f) == "" and file_problem(made / "absent") == ""
    os.chmod(f, 0o620)
    assert "writable by group (mode 0620)" in file_problem(f)
    (made / "l").symlink_to(f)
    assert "symbolic link" in file_problem(made / "l")
