"""A mixture-of-experts run resumes bit for bit (issue 28), as the dense runs do
(test_loop_resume.py): a qwen3_moe model trained with the split master (the default with bf16
compute) for K steps with checkpoints, then resumed in a fresh trainer of another init seed,
computes the uninterrupted run's losses, eval losses, masters, moments and step counts exactly."""
import pytest
import torch

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.data.data import load_dataset
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.runtime.config import OptimizerConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_exec.train.loop import LoopConfig, TrainLoop
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

pytestmark = pytest.mark.usefixtures("one_intraop_thread")

SPEC = ModelSpec(n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=256, family="qwen3_moe",
                 n_experts=8, experts_per_token=2, expert_ffn_hidden=32, norm_topk_prob=True)
STEPS, K = 6, 4


def _loop(ds, pol, ckpt_dir=None, seed=0, spec=SPEC):
    """A trainer of `spec` and its loop of STEPS steps (eval at 3, checkpoints every 2)."""
    tr = Trainer(spec, pol, TrainerConfig(optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.1), seed=seed))
    cfg = LoopConfig(steps=STEPS, lr_schedule=CosineSchedule(peak=3e-3, total_steps=STEPS, warmup_steps=2, min_lr=3e-4),
                     eval_every=3, eval_batches=2, ckpt_dir=ckpt_dir, save_every=2, keep_ckpts=0, progress=False)
    return tr, TrainLoop(tr, ds, cfg, seed=5, out=lambda *_: None)


def _state(tr):
    tr.flush()
    # the split master: its high halves are the working copy (wc.), its low halves master_lo.
    return {n: t.clone() for n, t in tr.store.t.items() if n.startswith(("wc.", "master_lo.", "moments."))} | \
        {f"steps.{u}": s.clone() for u, s in tr.store.steps.items()}


def test_an_moe_run_with_the_split_master_resumes_bit_for_bit(tmp_path):
    ds = load_dataset(None, ByteTokenizer(), seq=32, eval_fraction=0.01)
    pol = Policy(batch=2, seq=32, optimizer="pipelined", grad_clip=1.0)
    assert pol.split_master and pol.compute_dtype == "bf16"
    tr_u, straight = _loop(ds, pol)
    with tr_u:
        straight.run()
        want = _state(tr_u)
    tr_i, interrupted = _loop(ds, pol, ckpt_dir=tmp_path)
    with tr_i:
        interrupted.run(until=K)  # checkpoints at 2 and 4, then the process "dies"
    tr_r, resumed = _loop(ds, pol, ckpt_dir=tmp_path, seed=123)  # the weights must come from the checkpoint
    with tr_r:
        assert resumed.resume(tmp_path).name == "step-00000004" and resumed.step == K
        resumed.run()
        got = _state(tr_r)
    assert [interrupted.losses[s] for s in range(K)] == [straight.losses[s] for s in range(K)]
    assert [resumed.losses[s] for s in range(K, STEPS)] == [straight.losses[s] for s in range(K, STEPS)]
    assert resumed.evals == {6: straight.evals[6]}
    assert any(n.startswith("master_lo.") for n in want) and set(got) == set(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    assert ckpt_mod.latest_checkpoint(tmp_path).name == "step-00000006"
