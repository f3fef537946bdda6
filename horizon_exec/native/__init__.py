"""Host kernels in C, built on first use with the system C compiler and cached.

Only what torch has no kernel for lives here: `adamw.c`, the optimizer lane's one-pass AdamW
(bf16 gradient in, bf16 working copy out, fp32 or bf16 moments). It is plain C with no torch
headers: it builds in about a second and is called through ctypes, which releases the GIL for
the call, so it runs beside the other lanes like any torch kernel.

The shared object is cached under $HORIZON_CACHE_DIR (default ~/.cache/horizon/native; a
private folder in the temp dir if that cannot be written), named by a hash of the source, the
flags, the compiler's version and this CPU's feature flags, so `-march=native` code never
meets a CPU it was not built for. If no compiler works, `adamw()`
returns None and `status()` says why; the optimizer then uses torch's kernels (slower: three
passes) and refuses only what they cannot do (bf16 moments). HORIZON_NATIVE=0 turns the
kernels off; CC picks the compiler (default cc).
"""
import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("adamw.c")
# Tried in order: the first that builds is used. -ffp-contract=off: only the source's explicit
# fmaf calls fuse (the result must not depend on the compiler's choice); -fno-math-errno lets
# sqrtf vectorize (it changes no result). Without OpenMP the pragma is ignored: one thread.
_BASE = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno"]
FLAG_SETS = [_BASE + ["-march=native", "-fopenmp"], _BASE + ["-march=native"], _BASE + ["-fopenmp"], _BASE]


class AdamwHyper(ctypes.Structure):
    """horizon_adamw_hyper in adamw.c: one step's constants, as float."""
    _fields_ = [("decay", ctypes.c_float), ("lerp_w", ctypes.c_float), ("beta2", ctypes.c_float),
                ("one_m_beta2", ctypes.c_float), ("bc2_sqrt", ctypes.c_float), ("eps", ctypes.c_float),
                ("neg_step_size", ctypes.c_float), ("grad_scale", ctypes.c_float), ("scaled", ctypes.c_int32)]


_lock = threading.Lock()
_state: dict = {}  # "fn": the bound C function or None, "status": how it was built or why not


def cache_dir() -> Path:
    d = os.environ.get("HORIZON_CACHE_DIR")
    base = Path(d) if d else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "horizon"
    return base / "native"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _compiler_version(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.splitlines()[0] if out.stdout else ""


def _writable_cache_dir() -> Path:
    """cache_dir(), or a private folder under the temp dir when that cannot be written."""
    for d in (cache_dir(), Path(tempfile.gettempdir()) / f"horizon-native-{os.getuid()}"):
        try:
            d.mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            pass
    raise RuntimeError(f"no writable folder for the built kernel ({cache_dir()}, or the temp dir)")


def _build(cc: str) -> tuple[Path, list[str]]:
    """The cached shared object for the first flag set that compiles (built now if absent)."""
    src = SOURCE.read_bytes()
    version, cpu, errors = _compiler_version(cc), _cpu_flags(), []
    folder = _writable_cache_dir()
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([src, " ".join(flags).encode(), version.encode(),
                                         cpu.encode(), platform.machine().encode()])).hexdigest()[:16]
        out = folder / f"adamw-{key}.so"
        if out.exists():
            return out, flags
        fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            r = subprocess.run([cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True,
                               text=True, timeout=120)
            if r.returncode == 0:
                os.replace(tmp, out)  # atomic: a concurrent process sees all of it or nothing
                return out, flags
            errors.append(f"{' '.join(flags)}: {(r.stderr.strip().splitlines() or ['failed'])[-1]}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError("; ".join(errors))


def _load():
    if os.environ.get("HORIZON_NATIVE", "1") == "0":
        return None, "off (HORIZON_NATIVE=0)"
    cc = os.environ.get("CC", "cc")
    try:
        path, flags = _build(cc)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"unavailable: building {SOURCE.name} with {cc!r} failed: {e}"
    fn = lib.horizon_adamw
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(AdamwHyper), ctypes.c_int32]
    threads = "OpenMP" if "-fopenmp" in flags else "one thread"
    isa = "native ISA" if "-march=native" in flags else "generic ISA"
    return fn, f"({isa}, {threads}; {path})"


def adamw():
    """The C function horizon_adamw (see adamw.c), or None if it cannot be built here."""
    if "fn" in _state:  # loaded (or refused) once: no lock on the optimizer's hot path
        return _state["fn"]
    with _lock:
        if "fn" not in _state:
            _state["fn"], _state["status"] = _load()
        return _state["fn"]


def status() -> str:
    """One line: the native AdamW kernel's build, or why there is none."""
    adamw()
    return f"native AdamW kernel {_state['status']}"
