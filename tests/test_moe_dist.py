"""Data parallel with a mixture-of-experts model (issue 28), CPU backend, gloo: two ranks with
half the global batch each train what one rank does with the whole batch. Each token is routed
on its own rank exactly as it would be in the whole batch (the router sees one row at a time),
so only the order of the fp32 gradient sums differs: the dense test's tolerances
(test_dist_exec.py: every master weight within 1e-5, losses within 1e-6 relative, after 3 steps
with clipping on)."""
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_intraop_thread")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dist_worker  # noqa: E402
from test_dist_exec import torchrun  # noqa: E402


def one_rank(opt: str):
    from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    cfg = TrainerConfig(optimizer=OptimizerConfig(lr=1e-3), admission=AdmissionConfig(enabled=False))
    with Trainer(dist_worker.spec(False, moe=True), dist_worker.policy(1, opt), cfg) as tr:
        losses = [tr.step(t).loss for t in dist_worker.batches()]
        tr.flush()
        return torch.cat([tr.gather_master(u) for u in tr.units]), losses


def test_two_moe_ranks_train_what_one_rank_does_with_the_whole_batch(tmp_path):
    torchrun(tmp_path, "parity", 2, opt="pipelined", moe=1)
    got = torch.load(tmp_path / "master.pt")
    losses = json.loads((tmp_path / "losses.json").read_text())
    whole, whole_losses = one_rank("pipelined")
    assert got.shape == whole.shape
    assert (got - whole).abs().max().item() <= 1e-5
    assert losses == pytest.approx(whole_losses, rel=1e-6)
