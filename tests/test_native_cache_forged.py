"""Issue 30: a cached native AdamW object truncated, with its .sha256 recomputed to match, used
to be mapped by the trainer itself: SIGBUS, exit 135, no message. An object is now loaded only
after it passed a load check (its self-test) in a child process; the verdict is cached in a
`.verified` marker for its exact bytes, and a forged object is rebuilt."""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATUS = "from horizon_exec.optim.native import status; print(status())"


def _status(cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HORIZON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    env.pop("HORIZON_NATIVE", None)
    return subprocess.run([sys.executable, "-c", STATUS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_forged_cached_object_is_rebuilt_not_loaded(tmp_path):
    from horizon_exec.optim.native import cache_dir
    cache = tmp_path / "cache"
    if cache_dir().is_dir():  # this machine's build, when there is one: saves a compile
        shutil.copytree(cache_dir(), cache / "native")
    r = _status(cache)
    assert r.returncode == 0 and "native AdamW kernel (" in r.stdout, r.stdout + r.stderr
    so = next(p for p in (cache / "native").glob("kernels-*.so") if p.with_suffix(".verified").exists()
              or p.with_suffix(".sha256").exists())
    whole = so.read_bytes()
    so.write_bytes(whole[:len(whole) // 2])  # truncated; its checksum recomputed to match
    so.with_suffix(".sha256").write_text(hashlib.sha256(whole[:len(whole) // 2]).hexdigest() + "\n")

    r = _status(cache)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])  # was -7 (SIGBUS) in the trainer itself
    assert "refused by a load check in a child process" in r.stdout and "rebuilt" in r.stdout, r.stdout
    assert so.read_bytes() != whole[:len(whole) // 2]
    mark = so.with_suffix(".verified")
    assert mark.read_text().split()[0] == hashlib.sha256(so.read_bytes()).hexdigest()

    r = _status(cache)  # the verdict is cached: no rebuild, no note
    assert r.returncode == 0 and "rebuilt" not in r.stdout, r.stdout
