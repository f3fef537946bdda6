"""Adam moments in bf16 on the host (`states_dtype="bf16"`, the planner's lean-memory move),
run by the executor through the native AdamW kernel.

Exact check: the update of a step uses the moments in fp32 before they are rounded for
storage, so after ONE step from zero moments the master weights equal those of the same run
with fp32 moments bit for bit, and the stored moments are that run's moments rounded to bf16.
(That run is itself checked against transformers + torch.optim.AdamW in test_exec_parity.)
The host store holds 2 bytes per moment element, as the planner's footprint says.
"""
import dataclasses
import re

import pytest
import torch

from horizon_exec.optim import native
from horizon_exec.model.layout import unit_name
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Holds
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy, exact_policy

SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab=128)


pytestmark = pytest.mark.usefixtures("one_intraop_thread")


@pytest.fixture(autouse=True)
def _need_native():
    if native.adamw() is None:
        pytest.skip(native.status())


@pytest.mark.parametrize("optimizer", ["after", "pipelined"])
def test_first_step_equals_fp32_moments_then_rounds(optimizer):
    pol = exact_policy(batch=2, seq=16, act_ckpt_every=2, optimizer=optimizer, grad_clip=0.5)
    tokens = torch.randint(0, SPEC.vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    state = {}
    for states in ("fp32", "bf16"):
        cfg = TrainerConfig(optimizer=OptimizerConfig(lr=1e-3, weight_decay=0.1), seed=0)
        with Trainer(SPEC, dataclasses.replace(pol, states_dtype=states), cfg) as tr:
            tr.step(tokens)
            tr.flush()
            state[states] = {unit_name(SPEC, u): (tr.store.of(Holds.MASTER, u).clone(),
                                                 tr.store.of(Holds.MOMENTS, u).clone())
                             for u in tr.units}
    for u, (master32, mom32) in state["fp32"].items():
        master16, mom16 = state["bf16"][u]
        assert torch.equal(master16, master32), u
        assert mom16.dtype == torch.bfloat16 and mom16.numel() == mom32.numel()
        assert torch.equal(mom16, mom32.to(torch.bfloat16)), u


def test_store_holds_two_bytes_per_moment():
    fp32 = Policy(batch=2, seq=16)
    with Trainer(SPEC, fp32) as a, Trainer(SPEC, dataclasses.replace(fp32, states_dtype="bf16")) as b:
        moments = sum(t.numel() * t.element_size() for n, t in a.store.t.items() if n.startswith("moments."))
        assert a.store.nbytes - b.store.nbytes >= moments // 2 - 4096 * len(a.units)  # page alignment
        assert b.store.t["moments.0"].element_size() == 2


@native.use(None, "unavailable: building adamw.c with 'cc' failed: x")
def test_without_the_kernel_training_refuses_up_front():
    with pytest.raises(HorizonError, match="states_dtype=bf16: .*need the native AdamW kernel.*--states-dtype fp32"):
        Trainer(SPEC, Policy(batch=2, seq=16, states_dtype="bf16"))


def test_cli_trains_with_bf16_moments(capsys):
    rc = main(["train", "--model", "tiny", "--steps", "2", "--batch", "2", "--seq", "32",
               "--states-dtype", "bf16", "--no-progress"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    # the master: fp32, or split where the CPU has bf16 matrix instructions (the default there)
    assert re.search(r"optimizer: AdamW \(pipelined\), (fp32|split fp32) master.*, bf16 moments: native AdamW kernel \(",
                     out.out)
    assert "final loss" in out.out
