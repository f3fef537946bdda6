"""Host kernels in C, built on first use with the system C compiler and cached.

Only what torch has no kernel for lives here, in one shared object: `adamw.c`, the optimizer
lane's one-pass AdamW (bf16 gradient in, bf16 working copy out, fp32 or bf16 moments), and
`xent.c`, the LM head's loss and its gradient in one pass over each row of logits (the
`fused` loss kernel, model/xent.py). It is plain C with no torch headers: it builds in about
a second and is called through ctypes, which releases the GIL for the call, so it runs beside
the other lanes like any torch kernel.

The shared object is cached under $HORIZON_CACHE_DIR (default $XDG_CACHE_HOME/horizon/native,
else ~/.cache/horizon/native; an empty or relative XDG_CACHE_HOME is ignored, as the XDG spec
says), which must be private to the user (horizon_exec/private_dir.py: owned by you, not
writable by others, nor any folder above it but sticky ones): the trainer loads code from it
and trusts the self-test verdicts kept there. When it is not, or cannot be written, the build
goes to $TMPDIR/horizon-native-<euid> if that is private, else to a fresh folder from mkdtemp
for this process only (removed at exit); a folder refused as not private is said once on
stderr. Files in it are used only when they are regular files of yours that no one else can
write; others are removed and the object rebuilt. The object is named by a hash of the source, the
flags, the compiler's version and this CPU's feature flags, so `-march=native` code never
meets a CPU it was not built for. A new build is cached only once it passes a self-test in a
child process (selftest.py): a CPU that reports an instruction set it does not run kills the
child, not the trainer, and the next flag set (generic ISA) is used. Its SHA-256 is recorded
beside it (`.sha256`) and checked before every load: a cached object that was truncated or
changed (dlopen maps it, and touching the missing part is a SIGBUS) is rebuilt instead; and
an object is loaded only once it has passed the self-test in a child (a `.verified` marker
caches that verdict for the object's exact bytes, so the child runs once per build): a
truncated object whose checksum file was recomputed to match kills the child, not the
trainer, and is rebuilt. If no build works, `adamw()`
returns None and `status()` says why; the optimizer then uses torch's kernels (slower: three
passes) and refuses only what they cannot do (bf16 moments). HORIZON_NATIVE=0 turns the
kernels off; CC picks the compiler (default cc).
"""
import atexit
import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from horizon_exec.private_dir import NotPrivate, file_problem, make_private_dir
from horizon_exec.procfs import cpu_flags

SOURCE = Path(__file__).with_name("adamw.c")
XENT_SOURCE = Path(__file__).with_name("xent.c")
SOURCES = (SOURCE, XENT_SOURCE)
"""Compiled together into one object (their static helpers do not share names)."""
_PKG_ROOT = Path(__file__).resolve().parents[3]  # the folder holding horizon_exec
# Tried in order: the first that builds is used. -ffp-contract=off: only the source's explicit
# fmaf calls fuse (the result must not depend on the compiler's choice); -fno-math-errno lets
# sqrtf vectorize (it changes no result). Without OpenMP the pragma is ignored: one thread.
BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-Wno-psabi"]
"""Every build's flags; alone (the last of FLAG_SETS) they build the portable kernel."""
FLAG_SETS = [BASE_FLAGS + ["-march=native", "-fopenmp"], BASE_FLAGS + ["-march=native"], BASE_FLAGS + ["-fopenmp"],
             BASE_FLAGS]


class AdamwHyper(ctypes.Structure):
    """horizon_adamw_hyper in adamw.c: one step's constants, as float."""
    _fields_ = [("decay", ctypes.c_float), ("lerp_w", ctypes.c_float), ("beta2", ctypes.c_float),
                ("one_m_beta2", ctypes.c_float), ("bc2_sqrt", ctypes.c_float), ("eps", ctypes.c_float),
                ("neg_step_size", ctypes.c_float), ("grad_coef", ctypes.c_float), ("sr_seed", ctypes.c_uint64)]


_lock = threading.Lock()
_state: dict = {}  # "fns": load()'s C functions or None, "status": how they were built or why not


def cache_dir() -> Path:
    """The configured cache folder (not yet checked: _private_cache_dir does that)."""
    from horizon_exec.private_dir import horizon_cache_dir
    return horizon_cache_dir("native")


def _compiler_version(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.splitlines()[0] if out.stdout else ""


_warned: set = set()  # the not-private lines already said on stderr: each once per process


def _private_cache_dir() -> Path:
    """The folder the kernel is built into and loaded from: the first of cache_dir(), then
    $TMPDIR/horizon-native-<euid>, that is private (private_dir.py) and writable, else a fresh
    private folder from mkdtemp for this process. The predictable temp name is used only when
    it passes the check: another user who made it first gets a refusal, not your trust."""
    refused = []
    tmp = Path(tempfile.gettempdir())
    for d, link_ok in ((cache_dir(), True), (tmp / f"horizon-native-{os.geteuid()}", False)):
        try:
            real = make_private_dir(d, link_ok)
        except NotPrivate as e:
            refused.append(f"{d} ({e})")
            continue
        except OSError:
            continue  # cannot be created (read-only home, a file in the way): the next one, quietly
        if os.access(real, os.W_OK | os.X_OK):
            return _say_refused(refused, real)
    try:
        real = make_private_dir(tempfile.mkdtemp(prefix="horizon-native-"))  # 0700, an unpredictable name
    except NotPrivate as e:  # the temp dir itself is not safe (say, TMPDIR in a shared folder)
        raise RuntimeError(f"no private folder for the built kernel: {'; '.join(refused + [str(e)])}") from None
    except OSError as e:
        raise RuntimeError(f"no writable folder for the built kernel ({cache_dir()}, or the temp dir {tmp}: "
                           f"{e.strerror})") from None
    atexit.register(shutil.rmtree, real, ignore_errors=True)
    return _say_refused(refused, real)


def _say_refused(refused: list[str], chosen: Path) -> Path:
    """chosen; the folders refused as not private said on stderr, once per process, one line."""
    line = (f"horizon: warning: the native AdamW kernel is not cached in {' nor in '.join(refused)}: code is "
            f"loaded only from an absolute folder of yours that no one else can write; built in {chosen} instead")
    if refused and tuple(refused) not in _warned:
        _warned.add(tuple(refused))
        with contextlib.suppress(OSError, ValueError, AttributeError):  # stderr closed or None
            print(line, file=sys.stderr, flush=True)
    return chosen


def _self_test(path: str) -> str:
    """'' if the built object computes AdamW in a child process (selftest.py), else why not:
    a build for an instruction set this CPU does not really run dies there, not here."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_PKG_ROOT), os.environ.get("PYTHONPATH")])))
    try:
        # -P: `-m` would put the current folder first on sys.path, and a horizon_exec/ planted
        # wherever the user stands would run as the user instead of the self-test.
        r = subprocess.run([sys.executable, "-P", "-m", "horizon_exec.optim.native.selftest", path],
                           capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return "its self-test did not finish in 120 s"
    if r.returncode == 0:
        return ""
    if r.returncode < 0:
        try:
            sig = signal.Signals(-r.returncode).name
        except ValueError:
            sig = f"signal {-r.returncode}"
        return f"its self-test died with {sig}"
    last = (r.stdout.strip() or r.stderr.strip() or "failed").splitlines()[-1]
    return f"its self-test failed: {last}"


def _build(cc: str) -> tuple[Path, list[str], list[str]]:
    """The cached shared object for the first flag set that compiles and passes its self-test
    (built now if absent or damaged), its flags, and notes: flag sets rejected by a self-test,
    damaged objects rebuilt. A rejection is remembered beside the cache (`.rejected`), so it is
    not rebuilt on every start."""
    src = b"\0".join(f.read_bytes() for f in SOURCES)
    version, cpu, errors, rejected = _compiler_version(cc), cpu_flags(), [], []
    folder = _private_cache_dir()
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([src, " ".join(flags).encode(), version.encode(),
                                         cpu.encode(), platform.machine().encode()])).hexdigest()[:16]
        out = folder / f"kernels-{key}.so"
        mark = out.with_suffix(".rejected")
        if os.path.lexists(out):
            why = _untrusted(out) or _damaged(out) or _unverified(out)
            if not why:
                return out, flags, rejected
            rejected.append(f"the cached {out.name} was {why}: rebuilt")   # dlopen of it could die (SIGBUS)
            for f in (out, _sum_file(out), _verified_file(out)):
                with contextlib.suppress(OSError):
                    f.unlink()
        if file_problem(mark):  # a verdict no one else may give: dropped, the build is tried
            with contextlib.suppress(OSError):
                mark.unlink()
        if mark.exists():
            rejected.append(f"{_flags_name(flags)} build rejected: {mark.read_text().strip()}")
            continue
        fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            r = subprocess.run([cc, *flags, *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True,
                               text=True, timeout=120)
            if r.returncode != 0:
                errors.append(f"{' '.join(flags)}: {(r.stderr.strip().splitlines() or ['failed'])[-1]}")
                continue
            os.chmod(tmp, 0o700)  # the linker recreates the file with 0777 & ~umask: group-writable under umask 002
            why = _self_test(tmp)
            if why:
                _write_atomic(mark, why + "\n")  # 0600, as every file here: file_problem() trusts no other
                rejected.append(f"{_flags_name(flags)} build rejected: {why}")
                errors.append(f"{' '.join(flags)}: {why}")
                continue
            _write_atomic(_sum_file(out), _sha256(tmp) + "\n")  # before the object: never one unverifiable
            os.replace(tmp, out)  # atomic: a concurrent process sees all of it or nothing
            _write_atomic(_verified_file(out), _fingerprint(out) + "\n")  # its self-test passed above
            return out, flags, rejected
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError("; ".join(errors))


def _sum_file(so: Path) -> Path:
    return so.with_suffix(".sha256")


def _verified_file(so: Path) -> Path:
    return so.with_suffix(".verified")


def _fingerprint(so: Path) -> str:
    """What a `.verified` marker vouches for: the object's SHA-256, size, inode and mtime."""
    st = so.stat()
    return f"{_sha256(so)} {st.st_size} {st.st_ino} {st.st_mtime_ns}"


def _untrusted(so: Path) -> str:
    """'' when the object and the files vouching for it (`.sha256`, `.verified`) are regular
    files of this user that no one else can write (private_dir.file_problem), else why not."""
    for f in (so, _sum_file(so), _verified_file(so)):
        why = file_problem(f)
        if why:
            return f"untrusted ({why})"
    return ""


def _unverified(so: Path) -> str:
    """'' when this exact object passed a self-test in a child process (its `.verified` marker
    matches it), else the self-test is run now, in a child, and '' when it passes (the verdict
    is cached in the marker). A matching checksum alone is not enough: a truncated object
    whose `.sha256` was recomputed to match kills the process that maps it with SIGBUS
    (exit 135, no message); the child dies instead, and the object is rebuilt."""
    mark = _verified_file(so)
    try:
        fp = _fingerprint(so)
        if mark.is_file() and mark.read_text().strip() == fp:
            return ""
    except OSError as e:
        return f"unreadable ({e.strerror})"
    why = _self_test(str(so))
    if why:
        return f"refused by a load check in a child process ({why})"
    with contextlib.suppress(OSError):
        _write_atomic(mark, fp + "\n")
    return ""


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _damaged(so: Path) -> str:
    """'' when the cached object matches the SHA-256 recorded when it was built, else what is
    wrong (a truncated object is mapped by dlopen and faults with SIGBUS when touched)."""
    try:
        want = _sum_file(so).read_text().strip()
    except OSError:
        return "without a recorded checksum"
    try:
        return "" if _sha256(so) == want else "damaged (its checksum does not match the build's)"
    except OSError as e:
        return f"unreadable ({e.strerror})"


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _flags_name(flags: list[str]) -> str:
    return " ".join(f for f in flags if f not in BASE_FLAGS)


_PTR, _I32, _I64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
_HYPER = ctypes.POINTER(AdamwHyper)
SIGNATURES = {
    "horizon_adamw": [_PTR, _PTR, _I32, _PTR, _PTR, _I32, _PTR, _I64, _HYPER, _I32],
    "horizon_adamw_split": [_PTR, _PTR, _PTR, _I32, _PTR, _PTR, _I32, _I64, _HYPER, _I32],
    "horizon_adamw_bf16": [_PTR, _PTR, _I32, _PTR, _PTR, _I32, _I64, _HYPER, _I32],
    "horizon_split": [_PTR, _PTR, _PTR, _I64, _I32],
    "horizon_join": [_PTR, _PTR, _PTR, _I64, _I32],
    "horizon_round_sr": [_PTR, _PTR, _PTR, _I64],
    "horizon_sr_bits": [ctypes.c_uint64, _PTR, _I64],
    "horizon_xent": [_PTR, _I32, _PTR, _I64, _I64, _I64, ctypes.c_float, _I32, _PTR, _I32],
}
"""The entry points of adamw.c and xent.c and their C argument types (each returns int: 0, or
-1 on a bad argument)."""


def bind_all(lib) -> dict:
    """Every entry point (SIGNATURES), by name without the 'horizon_' prefix, with its C signature.
    An object without one of them raises OSError (load() then says why), never half-bound."""
    out = {}
    for name, argtypes in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise OSError(f"{name} is not in the built object") from None
        fn.restype, fn.argtypes = ctypes.c_int, argtypes
        out[name.removeprefix("horizon_")] = fn
    return out


def bind(lib):
    """lib.horizon_adamw with its C signature."""
    return bind_all(lib)["adamw"]


def load() -> tuple[dict | None, str]:
    """Find adamw.c's build for this machine in the cache, or build it now (FLAG_SETS, CC,
    HORIZON_CACHE_DIR and HORIZON_NATIVE as they are now), and bind it: (its C functions by
    name, or None; how it was built, or why not). The process's kernels (kernels(), status())
    are this, done once; calling it again does not change them (use() does)."""
    if os.environ.get("HORIZON_NATIVE", "1") == "0":
        return None, "off (HORIZON_NATIVE=0)"
    cc = os.environ.get("CC", "cc")
    try:
        path, flags, rejected = _build(cc)
        fns = bind_all(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"unavailable: building {SOURCE.name} with {cc!r} failed: {e}"
    threads = "OpenMP" if "-fopenmp" in flags else "one thread"
    isa = "native ISA" if "-march=native" in flags else "generic ISA"
    note = f"; {'; '.join(rejected)}" if rejected else ""
    return fns, f"({isa}, {threads}; {path}{note})"


def kernels() -> dict | None:
    """The C functions by name ('adamw', 'adamw_split', 'adamw_bf16', 'split', 'join', 'xent', ...),
    or None if they cannot be built here."""
    if "fns" in _state:  # loaded (or refused) once: no lock on the optimizer's hot path
        return _state["fns"]
    with _lock:
        if "fns" not in _state:
            _state["fns"], _state["status"] = load()
        return _state["fns"]


@contextlib.contextmanager
def use(fns: dict | None, status_detail: str):
    """Within the block the process's kernels are `fns` (None: as if none could be built here)
    with `status_detail` as status()'s reason, as load() returns them: to run a chosen build,
    or a machine without a compiler. The previous ones are back on exit."""
    with _lock:
        before = dict(_state)
        _state.update(fns=fns, status=status_detail)
    try:
        yield
    finally:
        with _lock:
            _state.clear()
            _state.update(before)


def adamw():
    """The C function horizon_adamw (see adamw.c), or None if it cannot be built here."""
    k = kernels()
    return k["adamw"] if k else None


def xent():
    """The C function horizon_xent (see xent.c), or None if it cannot be built here."""
    k = kernels()
    return k["xent"] if k else None


def status() -> str:
    """One line: the native AdamW kernel's build, or why there is none."""
    adamw()
    return f"native AdamW kernel {_state['status']}"
