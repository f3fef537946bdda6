"""Issue 30, 3: admission is an upper bound. The head's loss chunk counts what logsumexp
allocates inside its kernel (x - max: 4 B a fp32 logit, beside the logits: 8 B a logit; a 131k
vocabulary in fp32 peaked 35% above what was admitted), the measured side (memtrack) charges
it too, an address-space limit (`ulimit -v`) is a host budget, and a MemoryError that still
happens is one line, exit 1."""
import pytest
import torch

from horizon_exec.device.memtrack import TransientTracker
from horizon_exec.data import data as data_mod
from horizon_exec.runtime import admission
from horizon_sim.cli.main import main
from horizon_sim.schedule import work
from horizon_sim.specs.model import ModelSpec
from tests.train_run import TINY

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


class _Arena:
    ptrs: set = set()

    def __init__(self):
        self.temp = self.peak = 0

    def transient(self, delta, what=""):
        self.temp += delta
        self.peak = max(self.peak, self.temp)


def test_the_tracker_charges_logsumexp_scratch():
    logits = torch.randn(64, 1000)
    arena = _Arena()
    with TransientTracker(arena) as t:
        torch.logsumexp(logits, dim=-1)
    assert t.peak >= logits.numel() * 4 and arena.peak >= logits.numel() * 4 and arena.temp == 0


@pytest.mark.parametrize("a", [4, 2])
def test_the_head_counts_8_bytes_a_logit(a):
    spec = ModelSpec(n_layers=1, hidden=64, n_heads=2, n_kv_heads=2, ffn_hidden=128, vocab=131072)
    c = 1024
    assert work.head_temp_peak_bytes(spec, c, c, a) >= 8 * c * spec.vocab


def test_an_address_space_limit_is_a_host_budget(monkeypatch, capsys):
    import os
    vm_size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    monkeypatch.setattr(admission, "address_space_limit_bytes", lambda: vm_size + (100 << 20), raising=False)
    assert main(["train", *TINY, "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("horizon train: error: the run does not fit in host RAM: ") and \
        "available (address-space limit (ulimit -v) " in err.splitlines()[0], err


def test_a_memory_error_is_one_line_exit_1(monkeypatch, capsys):
    def no_memory(*a, **kw):
        raise MemoryError()
    monkeypatch.setattr(data_mod, "load_dataset", no_memory)
    assert main(["train", *TINY, "--steps", "1", "--compute-dtype", "fp32", "--no-working-copy"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("horizon train: error: out of memory: an allocation failed; ") and \
        len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
