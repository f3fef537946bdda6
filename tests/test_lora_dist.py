"""Issue 42: LoRA with data parallel (CPU backend, gloo), on one node and over nodes: ranks with
a share of the global batch each train the adapters one rank trains with the whole batch. Each
rank adds its adapters' gradient sums into the others' (ADAPTER_ALL_REDUCE over the node's ranks,
ADAPTER_NET_ALL_REDUCE over the nodes) before the same update, so only
the order of the fp32 sums differs: adapters and moments within 1e-5 after 3 steps with
clipping on, losses within 1e-6 relative (the dense test's tolerances, test_dist_exec.py)."""
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_intraop_thread")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dist_worker  # noqa: E402
from test_dist_exec import torchrun  # noqa: E402


def one_rank(micro: int, quant: str = "none", objective: str = "sft"):
    from horizon_exec.runtime.config import AdmissionConfig, OptimizerConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    cfg = TrainerConfig(optimizer=OptimizerConfig(lr=1e-2), admission=AdmissionConfig(enabled=False))
    with Trainer(dist_worker.spec(False), dist_worker.policy(1, "after", micro, lora=4, quant=quant, objective=objective), cfg) as tr:
        losses = [tr.step(t).loss for t in dist_worker.batches()]
        return torch.cat(dist_worker.adapters(tr)), losses


@pytest.mark.parametrize("nproc, nnodes, quant, objective", [(2, 1, "none", "sft"), (2, 1, "nf4", "sft"),
                                                             (2, 1, "none", "dpo"), (1, 2, "nf4", "dpo"),
                                                             (2, 2, "none", "sft")])
def test_two_ranks_train_the_adapters_one_rank_trains_with_the_whole_batch(tmp_path, nproc, nnodes, quant, objective):
    """One node of two ranks, or two nodes of one (each node its own whole base; the sums added
    up over the nodes by ADAPTER_NET_ALL_REDUCE). (nf4: the node's one packed base, written by
    its leader, read by its ranks; dpo: each rank its pairs, the loss the mean over every rank's.)"""
    torchrun(tmp_path, "parity", nproc, nnodes, lora=4, lr=1e-2, quant=quant, objective=objective)
    got = torch.load(tmp_path / "master.pt")
    losses = json.loads((tmp_path / "losses.json").read_text())
    whole, whole_losses = one_rank(1, quant, objective)
    assert got.shape == whole.shape and whole.abs().max() > 0
    assert (got - whole).abs().max().item() <= 1e-5
    assert losses == pytest.approx(whole_losses, rel=1e-6)


@pytest.mark.parametrize("nproc, nnodes", [(2, 1)])  # (the nodes' sum takes the same host tensors: test above)
def test_adapters_on_the_host_train_what_the_device_ones_do_over_ranks(tmp_path, nproc, nnodes):
    """Adapters on the host (their sums over the node's ranks taken from host memory): the
    adapters one rank trains on the device with the whole batch."""
    torchrun(tmp_path, "parity", nproc, nnodes, lora=4, lr=1e-2, adapters_on="host")
    got = torch.load(tmp_path / "master.pt")
    whole, whole_losses = one_rank(1)
    assert (got - whole).abs().max().item() <= 1e-5
    assert json.loads((tmp_path / "losses.json").read_text()) == pytest.approx(whole_losses, rel=1e-6)
