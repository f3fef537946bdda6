"""The executor with a split master (policy split_master, `--master-dtype split`).

- The optimizer op keeps the fp32 master exactly: after each step the master joined from the
  store equals what the fp32-master kernel (itself checked against torch's fused AdamW in
  test_native_adamw) makes of the same master, moments and host gradients, bit for bit, and
  the working copy the loads stream is its high half.
- The host store is 2 bytes per parameter smaller than the fp32 master's with its copy.
- Checkpoints hold the fp32 master (same format): a split run resumes bit for bit, and an
  fp32-master run resumes from a split run's checkpoint with the same master.
- HF export and load go through the fp32 master.
"""
import dataclasses

import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.checkpoints.hf_checkpoint import load_hf, save_hf
from horizon_exec.optim import native
from horizon_exec.optim.adamw import AdamW, clip_coef
from horizon_exec.optim.split import join
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.schedule import Holds
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, vocab=128)
POL = Policy(batch=2, seq=16, act_ckpt_every=2, grad_clip=0.05, split_master=True)  # clipping bites
LR, WD = 1e-3, 0.1


def _at_lr(seed: int, weight_decay: float = 0.0) -> TrainerConfig:
    return TrainerConfig(optimizer=OptimizerConfig(lr=LR, weight_decay=weight_decay), seed=seed)

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


@pytest.fixture(autouse=True)
def _need_native():
    if native.kernels() is None:
        pytest.skip(native.status())


def _tokens(seed=0):
    return torch.randint(0, SPEC.vocab, (2, 16), generator=torch.Generator().manual_seed(seed))


def _snapshot(tr):
    """Per unit: the joined master, moments (copies), the pending host grad, the step count."""
    return {u: (tr.gather_master(u), tr.store.of(Holds.MOMENTS, u).clone(),
                tr.store.of(Holds.HOST_GRAD, u).clone(), tr.store.steps[u].clone()) for u in tr.units}


def test_the_optimizer_op_keeps_the_fp32_master_bit_for_bit():
    ref_opt = AdamW(lr=LR, weight_decay=WD, kernel="native")
    with Trainer(SPEC, POL, _at_lr(0, WD)) as tr:
        for s in range(4):
            tr.step(_tokens(s))                 # pipelined: this step's update is pending
            before = _snapshot(tr)
            coef = clip_coef(POL.grad_clip, tr.store.scalar(Holds.GRAD_NORM))
            assert coef < 1.0
            tr.flush()                          # the OPTIMIZER ops on the split master
            for u, (master, mom, grad, step) in before.items():
                n = master.numel()
                m, v = mom.view(2, -1)
                ref_opt.step(master, grad[:n], m[:n], v[:n], step, coef)
                got = tr.gather_master(u)
                assert torch.equal(got.view(torch.int32), master.view(torch.int32)), f"step {s}, unit {u}"
                wc = tr.store.of(Holds.WORKING_COPY, u)[:n]
                tie = (got.view(torch.int32) & 0x1FFFF) == 0x8000  # ours rounds those away from zero
                assert torch.equal(wc[~tie], got[~tie].to(torch.bfloat16))
                assert torch.equal(join(wc, tr.store.of(Holds.MASTER_LOW, u)[:n]), got)


def test_store_is_two_bytes_per_parameter_smaller_and_the_run_tracks_fp32():
    plain = dataclasses.replace(POL, split_master=False)
    losses = {}
    with Trainer(SPEC, plain, _at_lr(0)) as a, Trainer(SPEC, POL, _at_lr(0)) as b:
        saved = a.store.nbytes - b.store.nbytes
        assert abs(saved - 2 * SPEC.total_params) <= 4096 * len(a.units)  # page-aligned buffers
        assert not any(b.store.has(Holds.MASTER, u) for u in b.units)
        for name, tr in (("fp32", a), ("split", b)):
            losses[name] = [tr.step(_tokens(s)).loss for s in range(5)]
    # same trajectory up to the working copy's ties and bf16 compute
    for x, y in zip(losses["fp32"], losses["split"]):
        assert abs(x - y) <= 1e-3 * abs(x)
    assert losses["split"][-1] < losses["split"][0]


def test_checkpoint_is_the_fp32_master_and_resumes_either_way(tmp_path):
    with Trainer(SPEC, POL, _at_lr(0)) as tr:
        for s in range(2):
            tr.step(_tokens(s))
        path = ckpt_mod.save_checkpoint(tmp_path, tr, 2)
        master = {u: tr.gather_master(u) for u in tr.units}
        want = [tr.step(_tokens(s)).loss for s in range(2, 4)]
    from safetensors import safe_open
    with safe_open(str(path / ckpt_mod.STATE), framework="pt") as f:
        names = set(f.keys())
        assert "master.0" in names and not any(n.startswith("master_lo") for n in names)
        assert f.get_tensor("master.0").dtype == torch.float32
    with Trainer(SPEC, POL, _at_lr(1)) as tr:   # another init: everything comes from the file
        ckpt_mod.load_checkpoint(path, tr)
        assert all(torch.equal(tr.gather_master(u), master[u]) for u in tr.units)
        assert [tr.step(_tokens(s)).loss for s in range(2, 4)] == want   # bit for bit
    with Trainer(SPEC, dataclasses.replace(POL, split_master=False), _at_lr(1)) as tr:
        ckpt_mod.load_checkpoint(path, tr)
        assert all(torch.equal(tr.gather_master(u), master[u]) for u in tr.units)


def test_hf_save_and_load_go_through_the_fp32_master(tmp_path):
    with Trainer(SPEC, POL, _at_lr(0)) as tr:
        tr.step(_tokens())
        save_hf(tr, tmp_path / "hf")
        sd = tr.state_dict()
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(saved) == set(sd) and all(torch.equal(saved[n], sd[n]) for n in sd)
    with Trainer(SPEC, POL, _at_lr(5)) as tr:
        load_hf(tr, tmp_path / "hf")
        again = tr.state_dict()
        assert all(torch.equal(again[n], sd[n]) for n in sd)
        tr.load_state_dict({n: t * 2 for n, t in sd.items()})
        assert all(torch.equal(tr.state_dict()[n], sd[n] * 2) for n in sd)


def test_a_split_master_needs_fp32_master_bf16_compute_and_the_copy():
    with pytest.raises(HorizonError, match="split_master=True .* compute_dtype=fp32"):
        Policy(split_master=True, compute_dtype="fp32", grad_dtype="fp32", working_copy=False)
    with pytest.raises(HorizonError, match="split_master=True .* working_copy=False"):
        Policy(split_master=True, working_copy=False)


def test_cli_trains_with_a_split_master(capsys):
    rc = main(["train", "--model", "tiny", "--steps", "2", "--batch", "2", "--seq", "32",
               "--master-dtype", "split", "--no-progress"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "final loss" in out.out
    assert main(["train", "--model", "tiny", "--steps", "1", "--master-dtype", "split", "--no-working-copy"]) == 2
    assert "drop --no-working-copy" in capsys.readouterr().err


@pytest.mark.parametrize("optimizer", ["pipelined", "after"])
def test_a_bf16_master_is_the_fp32_master_rounded_after_a_step(optimizer):
    """--master-dtype bf16 (no fp32 master): from weights bf16 holds exactly, the device sees
    the same weights as an fp32-master run, so the gradients are the same, and the updated bf16
    master is the fp32 master's update rounded to nearest even."""
    base = Policy(batch=2, seq=16, optimizer=optimizer, master_dtype="fp32")
    with Trainer(SPEC, base, _at_lr(0, WD)) as a:
        start = {n: t.to(torch.bfloat16).float() for n, t in a.state_dict().items()}
        a.load_state_dict(start)
        with Trainer(SPEC, dataclasses.replace(base, master_dtype="bf16", working_copy=False), _at_lr(1, WD)) as b:
            b.load_state_dict(start)
            assert b.store.of(Holds.MASTER, 0).dtype == torch.bfloat16
            assert a.step(_tokens()).loss == b.step(_tokens()).loss
            a.flush()
            b.flush()
            sa, sb = a.state_dict(), b.state_dict()
            changed = 0
            for n in sa:
                assert torch.equal(sb[n], sa[n].to(torch.bfloat16)), n
                changed += int((sb[n] != start[n].to(torch.bfloat16)).sum())
            assert changed > SPEC.total_params // 2  # lr 1e-3 moves most weights by more than half an ulp


def test_a_bf16_master_rounded_stochastically_resumes_exactly(tmp_path):
    """--master-rounding stochastic: the draws follow the seed, the unit and the step, so a run
    resumed from a checkpoint stores what the uninterrupted run stores, bit for bit; and it is
    not the run that rounds to nearest."""
    pol = Policy(batch=2, seq=16, master_dtype="bf16", working_copy=False, master_rounding="stochastic")
    with Trainer(SPEC, pol, _at_lr(0)) as tr:
        for s in range(2):
            tr.step(_tokens(s))
        path = ckpt_mod.save_checkpoint(tmp_path, tr, 2)
        want = [tr.step(_tokens(s)).loss for s in range(2, 4)]
        tr.flush()
        final = tr.state_dict()
    with Trainer(SPEC, pol, _at_lr(0)) as tr:
        ckpt_mod.load_checkpoint(path, tr)
        assert [tr.step(_tokens(s)).loss for s in range(2, 4)] == want
        tr.flush()
        assert all(torch.equal(t, final[n]) for n, t in tr.state_dict().items())
    with Trainer(SPEC, dataclasses.replace(pol, master_rounding="nearest"), _at_lr(0)) as tr:
        for s in range(4):
            tr.step(_tokens(s))
        tr.flush()
        assert any(not torch.equal(t, final[n]) for n, t in tr.state_dict().items())
    with pytest.raises(HorizonError, match="master_rounding='stochastic' rounds a bf16 master"):
        Policy(master_rounding="stochastic")
