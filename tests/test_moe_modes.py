"""A mixture-of-experts model in the optimizer modes and the disk tier (issue 28): with clipping
off each mode applies the same AdamW to the same gradients, only at other times, so 'backward'
(each layer as its gradient arrives), 'after' (all after the backward) and the split master's
low halves and moments on disk (disk_tier='moments+low') train what 'pipelined' with both in
RAM trains, bit for bit: losses, the fp32 masters (both halves) and the moments."""
import dataclasses

import pytest
import torch

from horizon_exec.runtime.config import OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from tests.unit_state import moments

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=128, family="qwen3_moe",
                 n_experts=8, experts_per_token=2, expert_ffn_hidden=32, norm_topk_prob=True)
BASE = Policy(batch=2, seq=16, optimizer="pipelined", grad_clip=0.0)
VARIANTS = {"backward": dict(optimizer="backward"), "after": dict(optimizer="after"),
            "moments+low on disk": dict(disk_tier="moments+low")}


def _run(pol, folder):
    cfg = TrainerConfig(optimizer=OptimizerConfig(lr=3e-3), runtime=RuntimeConfig(disk_dir=folder), seed=0)
    with Trainer(SPEC, pol, cfg) as tr:
        g = torch.Generator().manual_seed(0)
        losses = [tr.step(torch.randint(0, SPEC.vocab, (2, 16), generator=g)).loss for _ in range(3)]
        tr.flush()
        return losses, {u: (tr.gather_master(u), moments(tr, u)) for u in tr.units}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_moe_trains_alike_in_every_optimizer_mode_and_with_the_disk_tier(variant, tmp_path):
    pol = dataclasses.replace(BASE, **VARIANTS[variant])
    assert pol.split_master
    want_losses, want = _run(BASE, tmp_path)
    losses, got = _run(pol, tmp_path)
    assert losses == want_losses
    for u, (master, moms) in want.items():
        assert torch.equal(got[u][0], master) and torch.equal(got[u][1], moms), u
