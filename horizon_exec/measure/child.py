"""Run a measurement in a fresh Python process: `python -m MODULE` with a JSON request on stdin,
its result the last JSON line it prints. Each measurement then has its own RSS peak and
inherits no warmed caches or allocator state (probe.py, peer_deepspeed.py).

    res = run_json_child("horizon_exec.measure.probe", req, what="probe of tiny", timeout_s=600)
"""
import json
import subprocess
import sys

from horizon_exec.child_env import ROOT, child_env  # noqa: F401 - re-exported: measure's children use them
from horizon_sim.errors import HorizonError


def run_json_child(module: str, request: dict, *, what: str, env: dict | None = None,
                   timeout_s: float = 600.0) -> dict:
    """The last JSON line `python -m module` prints for `request`; a timeout, a non-zero exit or
    no JSON is a one-line HorizonError naming `what` with the child's last lines (warnings left
    out)."""
    try:
        out = subprocess.run([sys.executable, "-m", module], input=json.dumps(request), capture_output=True,
                             text=True, timeout=timeout_s, env=child_env(env), cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise HorizonError(f"{what}: no result within {timeout_s:g} s") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = [ln for ln in (out.stderr or out.stdout).strip().splitlines() if "Warning" not in ln][-3:]
        raise HorizonError(f"{what} failed (exit {out.returncode}): {' | '.join(tail) or 'no output'}")
    return json.loads(lines[-1])
