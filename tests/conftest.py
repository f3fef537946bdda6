"""Fixtures shared by the test modules."""
import os
import shutil
import signal
import tempfile

import pytest

_SESSION_CACHE = "HORIZON_TEST_SESSION_CACHE"


def pytest_configure(config):
    """Hermetic caches: the whole session (its xdist workers and the processes tests start
    inherit the variable) keeps Horizon's per-user cache (the AdamW kernel, this machine's
    estimate or calibration) in a private folder of its own, never the user's ~/.cache. A
    developer's `horizon calibrate` must not change what the tests see: with a cached
    calibration the admission and the plan report take other paths than on a clean machine."""
    _sigint_as_a_terminal_leaves_it()
    d = os.environ.get(_SESSION_CACHE)
    if not d:  # the controller (or a run without xdist): make it; workers find it set
        d = tempfile.mkdtemp(prefix="horizon-test-cache-")  # mode 0700: a private folder
        os.environ[_SESSION_CACHE] = d
        config._horizon_session_cache = d
    os.environ["HORIZON_CACHE_DIR"] = d


def _sigint_as_a_terminal_leaves_it():
    """A suite started as a background job (`make test &` in a script) inherits SIGINT ignored,
    and so would every `horizon` it starts, which then rightly keeps ignoring it
    (train/stop_signals.py): the tests that stop a run with SIGINT need it as a terminal leaves
    it. SIGHUP stays as it is (`nohup make test` must survive its terminal)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config):
    d = getattr(config, "_horizon_session_cache", None)
    if d:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def one_intraop_thread():
    """Torch on the test's own thread with one intra-op thread: the tests run tiny ops, whose
    OpenMP barriers stall on a busy 2-core machine (the executor's lanes set their own thread
    counts). A module opts in with `pytestmark = pytest.mark.usefixtures("one_intraop_thread")`."""
    import torch  # here, not at the top: planner-only tests must not import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _cpu_backend_by_default(request, monkeypatch):
    """The suite tests the CPU backend unless a test's id names cuda (test_exec_cuda.py, the
    CUDA calibration's tests). On a GPU box `horizon train` and `calibrate` without --device
    would take the GPU (cli/default_device.py) and print and measure other things than these
    tests assert; here they take the CPU backend, in this process (cuda_here) and in the
    processes a test starts (CUDA_VISIBLE_DEVICES empty: torch sees no device there). A test
    of the GPU default patches cuda_here itself, after this."""
    if "cuda" in request.node.nodeid.lower():
        return
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr("horizon_exec.measure.machine.detect.cuda_here", lambda: False)

