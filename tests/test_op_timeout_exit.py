"""Issue 43, item 5: a run given up on the op timeout while a lane is still inside a native call
exits 1 with its one line. It died with 'terminate called without an active exception'
(SIGABRT, exit 134): the interpreter's teardown ended the stuck lane thread when its call
returned, by an unwind through torch's C++ frames. The engine now notes such a lane when it
closes, and the program leaves without that teardown (horizon_sim/cli/stuck_threads.py)."""
import subprocess
import sys
import threading
import time

import pytest

from horizon_exec.device.backend import Backend
from horizon_exec.errors import ExecError
from horizon_exec.runtime.engine import Engine
from horizon_sim.schedule import OpKind
from horizon_sim.schedule.op import Op
from tests.train_run import ROOT, TINY, env


@pytest.mark.parametrize("entry", [[], ["--as-rank-module"]], ids=["program", "train_cmd module"])
def test_op_timeout_with_a_lane_stuck_in_native_code_is_one_line_exit_1(entry):
    """As the `horizon` program, and as `python -m horizon_exec.cli.train_cmd` in one process
    (dist/context.exit_rank's way out)."""
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "stall_native_op.py"), *entry, *TINY, "--steps", "3",
                        "--op-timeout", "0.5"],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert "terminate called" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("horizon train: error: no op started or finished for 0.5s"), lines
    assert "horizon train:" in r.stdout   # what was printed before is not lost to the quick exit


class _HostClock(Backend):
    """Lanes with no device: marks are host times (the CPU backend without its thread settings)."""

    def mark(self, lane):
        return time.perf_counter()

    def seconds(self, mark):
        return mark


def test_closing_an_engine_notes_a_lane_left_in_its_op_and_stops_it_once_free():
    """A lane still in an op when its step is given up is named to stuck_threads; once the op
    returns, the lane skips what is left of its queue and stops (it stayed blocked on it)."""
    from horizon_sim.cli import stuck_threads
    release = threading.Event()
    eng = Engine(_HostClock(), runner=lambda op: release.wait(20), timeout_s=0.3)
    ops = [Op(id=0, kind=OpKind.FORWARD, unit=0), Op(id=1, kind=OpKind.FORWARD, unit=1, deps=(0,))]
    stuck = "lane compute in op 0 forward[0]"
    try:
        with pytest.raises(ExecError, match="no op started or finished for 0.3s"):
            eng.run(ops, n_ids=2)
        assert eng.broken
        eng.close()
        assert stuck in stuck_threads.still_running()
    finally:
        release.set()
    for t in eng._threads:
        t.join(5)
    assert not any(t.is_alive() for t in eng._threads) and stuck not in stuck_threads.still_running()
