"""The executor under the default master (issue 27 item 4): Policy() is the split master, and it
trains as the whole fp32 master does.

- In each optimizer mode, with micro-batches in either order and with the moments on disk, a
  default run and a `master_dtype='fp32'` run from the same bf16-exact weights hold the same
  fp32 master bit for bit after every step, as long as the working copies they load are the
  same. They differ only where a master lands on an exact tie of the bf16 rounding (low half
  0x8000 under an even high half: the split's copy rounds away from zero, torch's cast to
  even; adamw.c "The split master"): the test checks that the copies differ there and only
  there, and that at least two updates were compared before any tie (in one of a few starts:
  where the first tie falls depends on the bf16 kernels' summation order, which differs by CPU).
- The host store is 2 bytes per parameter smaller (page-aligned buffers aside).
"""
import pytest
import torch

from horizon_exec.optim import native
from horizon_exec.runtime.config import OptimizerConfig, RuntimeConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.schedule import Holds
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

# small: about 0.1 master elements in 2^17 land on an even tie per update, so most steps compare
SPEC = ModelSpec(n_layers=2, hidden=32, n_heads=2, n_kv_heads=1, ffn_hidden=48, vocab=64)
STEPS = 3
MODES = {
    "pipelined": dict(grad_clip=0.05),  # clipping bites
    "after": dict(optimizer="after", grad_clip=0.05),
    "backward": dict(optimizer="backward", grad_clip=0.0),
    "micro": dict(batch=4, micro_batches=2),
    "layer": dict(batch=4, micro_batches=2, mb_order="layer"),
    "disk": dict(disk_tier="moments"),
    "bf16 moments": dict(states_dtype="bf16"),
}

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


@pytest.fixture(autouse=True)
def _need_native():
    if native.kernels() is None:
        pytest.skip(native.status())


def _cfg(pol: Policy, folder, seed: int) -> TrainerConfig:
    """lr 1e-3 with weight decay; the disk tier's file (if any) in `folder`."""
    disk = str(folder) if pol.disk_tier != "none" else None
    return TrainerConfig(optimizer=OptimizerConfig(lr=1e-3, weight_decay=0.1), runtime=RuntimeConfig(disk_dir=disk),
                         seed=seed)


def _tokens(seed: int, batch: int) -> torch.Tensor:
    return torch.randint(0, SPEC.vocab, (batch, 16), generator=torch.Generator().manual_seed(seed))


def _even_ties(master: torch.Tensor) -> torch.Tensor:
    """Where the bf16 roundings of the split (ties away) and of torch (ties to even) differ."""
    u = master.view(torch.int32)
    return ((u & 0x1FFFF) == 0x8000) & ~master.isnan()


SEEDS = (1, 2, 3)
"""Starts tried until one compares two updates before a tie (MODES' docstring)."""


def _compare(mode: str, kw: dict, folder, seed: int) -> int:
    """Train a default and a whole-fp32-master run from the same start (seed's weights, made
    bf16-exact); assert after every step what the module docstring says; the updates compared
    before the first tie."""
    default, whole = Policy(**kw), Policy(**kw, master_dtype="fp32")
    assert default.split_master and not whole.split_master
    with Trainer(SPEC, default, _cfg(default, folder, 0)) as a, Trainer(SPEC, whole, _cfg(whole, folder, seed)) as b:
        # the same start, bf16-exact, so the first loads are the same
        start = {n: t.to(torch.bfloat16).float() for n, t in b.state_dict().items()}
        a.load_state_dict(start)
        b.load_state_dict(start)
        compared = 0
        for s in range(STEPS):
            assert a.step(_tokens(s, kw["batch"])).loss == b.step(_tokens(s, kw["batch"])).loss, f"step {s}"
            a.flush()
            b.flush()
            ties = 0
            for u in a.units:
                m = b.gather_master(u)
                assert torch.equal(a.gather_master(u).view(torch.int32), m.view(torch.int32)), f"step {s}, unit {u}"
                n = m.numel()
                wa, wb = a.store.of(Holds.WORKING_COPY, u)[:n], b.store.of(Holds.WORKING_COPY, u)[:n]
                tie = _even_ties(m)
                assert torch.equal(wa != wb, tie), f"step {s}, unit {u}: copies differ off the even ties"
                ties += int(tie.sum())
            compared += 1
            if ties:  # the next loads differ by one bf16 ulp there: the runs part (by design)
                break
        return compared


@pytest.mark.parametrize("mode", list(MODES))
def test_a_default_run_keeps_the_fp32_master_bit_for_bit(mode, tmp_path):
    kw = {"batch": 2, "seq": 16, **MODES[mode]}
    compared = []
    for seed in SEEDS:
        (tmp_path / str(seed)).mkdir()
        compared.append(_compare(mode, kw, tmp_path / str(seed), seed))
        if compared[-1] >= 2:
            break
    assert compared[-1] >= 2, f"{mode}: an even tie after {compared} update(s) from seeds {SEEDS}: add a seed"


def test_the_default_store_is_two_bytes_a_parameter_smaller(tmp_path):
    default, whole = Policy(batch=2, seq=16), Policy(batch=2, seq=16, master_dtype="fp32")
    with Trainer(SPEC, default, _cfg(default, tmp_path, 0)) as a, Trainer(SPEC, whole, _cfg(whole, tmp_path, 0)) as b:
        saved = b.store.nbytes - a.store.nbytes
        assert abs(saved - 2 * SPEC.total_params) <= 4096 * len(a.units)  # page-aligned buffers
        assert not any(a.store.has(Holds.MASTER, u) for u in a.units)
        assert all(a.store.has(Holds.MASTER_LOW, u) for u in a.units)


def test_a_checkpoint_of_the_whole_fp32_master_resumes_under_the_default(tmp_path):
    """Written before the split master was the default, or before it existed (no split_master
    in the recorded policy): the checkpoint holds the fp32 master, which the default run splits
    as it loads; a checkpoint of the default run resumes `--master-dtype fp32` the same way."""
    from horizon_exec.checkpoints import ckpt as ckpt_mod
    default, whole = Policy(batch=2, seq=16), Policy(batch=2, seq=16, master_dtype="fp32")
    with Trainer(SPEC, whole, _cfg(whole, tmp_path, 0)) as tr:
        tr.step(_tokens(0, 2))
        path = ckpt_mod.save_checkpoint(tmp_path / "ck", tr, 1)
        tr.flush()
        master = {u: tr.gather_master(u) for u in tr.units}
    with Trainer(SPEC, default, _cfg(default, tmp_path, 5)) as tr:
        meta = {"model": SPEC.to_dict(), "layout": {"nodes": 1, "devices_per_node": 1, "node": 0},
                "policy": {k: v for k, v in whole.to_dict().items() if k != "split_master"}}
        ckpt_mod.check_compatible(path, meta, tr)  # the older record: no split_master
        ckpt_mod.load_checkpoint(path, tr)
        tr.flush()
        assert all(torch.equal(tr.gather_master(u), master[u]) for u in tr.units)


def test_horizon_train_falls_back_to_the_whole_master_without_the_native_kernels(monkeypatch):
    """The split needs the native kernels: where they do not build, `horizon train`'s default is
    the whole fp32 master (torch's AdamW), not a run that stops on its default."""
    from horizon_exec.device.default_master import default_master
    assert default_master("bf16", True) is None          # Policy's default: the split
    assert default_master("fp32", False) is None         # Policy's default: the whole master
    monkeypatch.setattr(native, "kernels", lambda: None)
    assert default_master("bf16", True) == "fp32"
    assert default_master("bf16", False) is None
    assert Policy.from_choices(master=default_master("bf16", True)).master_choice == "fp32"
