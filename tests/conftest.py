"""Fixtures shared by the test modules."""
import pytest


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
